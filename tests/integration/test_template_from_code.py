"""Templates from code (issue 27) on real sandboxes: a Template with apt, pip, copy, env, workdir and a
custom pyinfra deploy is built by ``Manager.build_template``; a sandbox made from it has everything
and passes the catalogue's state controls; the same definition again is a cache hit doing no work; a
failing step or a broken control leaves nothing behind; a template in use cannot be removed; the CLI
builds, lists and removes.

Packages come from a LOCAL apt repository (a .deb built here with dpkg-deb, indexed with
dpkg-scanpackages) and a LOCAL PEP 503 pip index (a wheel built here), served by an HTTP server in the
test's simulated internet (the ``wan`` netns of tests/hardening/testnet.py) and reached through the
build sandbox's egress allow-list: no traffic leaves the machine. One template is built for the whole
module; the registry lives in a private state directory, so the host's own registry is untouched.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import sandbox_rt
from sandbox_rt import ConfigError, Manager, Settings, StateConflict, Template, TemplateBuildError
from sandbox_rt.templates import BuildResult, TemplateRegistry, remove_template
from sandbox_rt.templates.build import BUILD_LABEL
from tests.hardening import checks, hosts
from tests.hardening.testnet import SimNet, simulated_network
from tests.integration.provision_helpers import destroy_labelled, sh, tcp_open, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    # as every integration module here: a developer's non-root run skips it; .ci/run runs as root
    pytest.mark.skipif(os.geteuid() != 0, reason="starts containers and builds a test network: needs root"),
]

REPO_IP = "198.18.0.90"  # the package server's address in the wan netns (RFC 2544 space)
DEB = "sbxrt-hello"
WHEEL_PROJECT = "sbxrt-tiny"
RUN_ID = uuid.uuid4().hex[:6]
NAME = f"it-{RUN_ID}"
LABELS = {"test-session": f"template-{RUN_ID}"}

SERVER = """
import functools, http.server, sys
class Server(http.server.ThreadingHTTPServer):
    def server_bind(self):  # no reverse lookup of the address (no DNS in the netns)
        http.server.socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[2])
Server((sys.argv[1], 80), handler).serve_forever()
"""


# -- the local package sources ---------------------------------------------------------------------
def _deb(root: Path) -> None:
    pkg = root / "pkg"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "usr/bin").mkdir(parents=True)
    (pkg / "DEBIAN/control").write_text(
        f"Package: {DEB}\nVersion: 1.0\nArchitecture: all\nMaintainer: sandbox_rt tests <t@invalid>\n"
        "Description: a package the template tests install from a local repository\n"
    )
    tool = pkg / "usr/bin" / DEB
    tool.write_text("#!/bin/sh\necho sbxrt-hello-ok\n")
    tool.chmod(0o755)
    repo = root / "www/apt"
    repo.mkdir(parents=True)
    sh("dpkg-deb", "--root-owner-group", "--build", str(pkg), str(repo / f"{DEB}_1.0_all.deb"))
    index = subprocess.run(
        ["dpkg-scanpackages", "--multiversion", ".", "/dev/null"],
        cwd=repo, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    (repo / "Packages").write_text(index.stdout)
    data = (repo / "Packages").read_bytes()
    (repo / "Release").write_text(
        "Origin: sandbox_rt-tests\nLabel: sandbox_rt-tests\n"
        f"SHA256:\n {hashlib.sha256(data).hexdigest()} {len(data)} Packages\n"
    )


def _wheel(root: Path) -> None:
    dist = "sbxrt_tiny-1.0.dist-info"
    files = {
        "sbxrt_tiny/__init__.py": b'VALUE = "tiny-wheel-ok"\n',
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {WHEEL_PROJECT}\nVersion: 1.0\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: sandbox_rt-tests\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel_name = "sbxrt_tiny-1.0-py3-none-any.whl"
    packages = root / "www/packages"
    packages.mkdir(parents=True)
    with zipfile.ZipFile(packages / wheel_name, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    sha = hashlib.sha256((packages / wheel_name).read_bytes()).hexdigest()
    project = root / "www/simple" / WHEEL_PROJECT
    project.mkdir(parents=True)
    (project / "index.html").write_text(
        f'<!DOCTYPE html><html><body><a href="/packages/{wheel_name}#sha256={sha}">{wheel_name}</a>'
        "</body></html>\n"
    )
    (root / "www/simple/index.html").write_text(
        f'<!DOCTYPE html><html><body><a href="{WHEEL_PROJECT}/">{WHEEL_PROJECT}</a></body></html>\n'
    )


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("template-sources")
    _deb(root)
    _wheel(root)
    (root / "app/conf").mkdir(parents=True)
    (root / "app/conf/app.ini").write_text("[app]\nmode = test\n")
    (root / "app/run.sh").write_text("#!/bin/sh\necho app-ok\n")
    (root / "app/run.sh").chmod(0o755)
    return root


@pytest.fixture(scope="module")
def wan(sources: Path) -> Iterator[SimNet]:
    """The simulated internet with the package server on REPO_IP:80."""
    with simulated_network(SimNet()) as net:
        sh("ip", "-n", net.wan_ns, "addr", "add", f"{REPO_IP}/32", "dev", "lo")
        server = subprocess.Popen(
            ["ip", "netns", "exec", net.wan_ns, sys.executable, "-c", SERVER, REPO_IP, str(sources / "www")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        try:
            wait_for(lambda: tcp_open(REPO_IP, 80), 15, "the package server")
            yield net
        finally:
            server.kill()
            server.wait(timeout=10)


# -- the runtime with a private registry -------------------------------------------------------------
@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    s = Settings.load()
    if s.backend != "lxc" or not (s.lxc_path / s.template / "config").is_file():
        pytest.fail("this host is not prepared: run `ansible-playbook -i inventories/local site.yml`")
    return dataclasses.replace(s, state_dir=tmp_path_factory.mktemp("template-state"))


@pytest.fixture(scope="module")
def manager(settings: Settings) -> Iterator[Manager]:
    mgr = Manager(settings)
    yield mgr
    destroy_labelled(mgr, LABELS, {BUILD_LABEL: NAME})
    for entry in TemplateRegistry(settings.state_dir).read().values():
        with contextlib.suppress(sandbox_rt.SandboxError):
            remove_template(mgr, entry.name)


def use_local_mirror() -> None:
    """A custom pyinfra deploy: the test's repository is the only apt source."""
    from pyinfra.operations import files

    files.put(
        name="apt sources: the local mirror",
        src=io.StringIO(f"deb [trusted=yes] http://{REPO_IP}/apt ./\n"),
        dest="/etc/apt/sources.list",
    )
    files.file(name="no other apt source", path="/etc/apt/sources.list.d/debian.sources", present=False)


def definition(sources: Path) -> Template:
    return (
        Template()
        .deploy(use_local_mirror, egress=[REPO_IP])
        .apt_install(DEB)
        .pip_install(WHEEL_PROJECT, index_url=f"http://{REPO_IP}/simple")
        .copy(sources / "app", "/opt/app")
        .env(APP_MODE="test", GREETING="hello from the template")
        .workdir("/srv/work")
        .run("/opt/app/run.sh > built-here.txt && sbxrt-hello >> built-here.txt")
    )


@pytest.fixture(scope="module")
def built(manager: Manager, wan: SimNet, sources: Path) -> tuple[BuildResult, list[str]]:
    log: list[str] = []
    try:
        result = manager.build_template(definition(sources), NAME, on_log=log.append)
    except TemplateBuildError:
        print("\n".join(log))  # the whole build's output, for the report of the failure
        raise
    print(log[-1])  # "built <name> (<container>) in <s> s"
    return result, log


def _made_from(manager: Manager, template: str, **kwargs: object) -> sandbox_rt.Sandbox:
    return manager.create(template=template, labels=LABELS, memory_mb=512, **kwargs)  # type: ignore[arg-type]


def _leftovers(settings: Settings, name: str) -> list[str]:
    """What a build of ``name`` could leave: build sandboxes, scratch dirs, template containers."""
    found = [p.name for p in settings.lxc_path.iterdir() if p.name.startswith((f"built-{name}-", ".tmpl-"))]
    found += [r.id for r in Manager(settings).list(labels={BUILD_LABEL: name})]
    return found


# -- the built template ------------------------------------------------------------------------------
def test_the_build_ran_every_step_with_pyinfra_and_streamed_it(built: tuple[BuildResult, list[str]]) -> None:
    result, log = built
    assert not result.cached and result.template.base == "default"
    steps = [line for line in log if line.startswith("==> step ")]
    assert len(steps) == 7 and steps[1] == f"==> step 2/7 apt_install({DEB})", steps
    text = "\n".join(log)
    assert f"http://{REPO_IP}/apt" in text  # apt-get update's output reached on_log as it ran
    assert "Successfully installed" in text and WHEEL_PROJECT in text  # pip's
    assert f"build sandbox egress: {REPO_IP}" in text


def test_a_sandbox_from_the_template_has_everything(
    manager: Manager, built: tuple[BuildResult, list[str]]
) -> None:
    assert NAME in manager.templates()  # the registry joined the host's names: create() takes it
    with _made_from(manager, NAME) as sb:
        assert sb.exec(DEB).stdout == b"sbxrt-hello-ok\n"
        r = sb.exec("python3 -c 'import sbxrt_tiny; print(sbxrt_tiny.VALUE)'")
        assert r.stdout == b"tiny-wheel-ok\n", r.stderr
        assert sb.read_file("/opt/app/conf/app.ini") == b"[app]\nmode = test\n"
        assert sb.exec("/opt/app/run.sh").stdout == b"app-ok\n"  # the mode came along
        assert sb.read_file("/srv/work/built-here.txt") == b"app-ok\nsbxrt-hello-ok\n"  # run() in workdir
        assert sb.exec('echo "$APP_MODE|$GREETING"').stdout == b"test|hello from the template\n"
        assert sb.read_file("/etc/apt/sources.list").startswith(
            f"deb [trusted=yes] http://{REPO_IP}".encode()
        )
        # the build sandbox's identity did not come along: own host key, name, machine-id
        assert sb.exec("hostname").stdout.decode().strip() == sb.hostname
        assert sb.exec("ls /etc/ssh/authorized_keys").stdout == b"sandbox\n"  # no root key from the build


def test_the_catalogues_state_controls_pass_on_it(
    manager: Manager, settings: Settings, built: tuple[BuildResult, list[str]], tmp_path: Path
) -> None:
    rootfs = settings.lxc_path / built[0].template.container / "rootfs"
    with _made_from(manager, NAME) as sb:
        target = checks.Target(
            sb,
            hosts.sandbox_host(sb, settings, tmp_path),
            hosts.sandbox_root_host(sb, settings),
            hosts.known_hosts_path(tmp_path, sb),
            settings,
        )
        for check in (
            checks.check_user_unprivileged,
            checks.check_no_sudo,
            checks.check_root_locked,
            checks.check_authorized_keys,
            checks.check_root_login_refused,
            checks.check_password_refused,
            checks.check_only_sandbox_user,
            checks.check_no_forwarding,
            checks.check_host_key,
            checks.check_sshd_limits,
            checks.check_nproc,
            checks.check_nofile,
            checks.check_init,
            checks.check_unprivileged,
            checks.check_no_block_devices,
            checks.check_no_setuid_shells,
            checks.check_caps_dropped,
            checks.check_no_new_privs,
        ):
            check(target)
        for rootfs_check in (checks.check_hostname, checks.check_resolver, checks.check_services_off):
            rootfs_check(target, rootfs)


def test_the_same_definition_again_is_a_cache_hit(
    manager: Manager, sources: Path, built: tuple[BuildResult, list[str]]
) -> None:
    before = {r.id for r in manager.list()}
    log: list[str] = []
    again = manager.build_template(definition(sources), NAME, on_log=log.append)
    assert again.cached and again.template == built[0].template
    assert again.duration_s < 1.0 and not any(line.startswith("==> step") for line in log)
    assert {r.id for r in manager.list()} == before  # no build sandbox was made


# -- all or nothing ----------------------------------------------------------------------------------
def test_a_failing_step_leaves_nothing_behind(manager: Manager, settings: Settings, sources: Path) -> None:
    name = f"fail-{RUN_ID}"
    bad = Template().copy(sources / "app", "/opt/app").run("echo about to fail; exit 3")
    with pytest.raises(TemplateBuildError) as err:
        manager.build_template(bad, name)
    assert err.value.step == "step 2/2 run(echo about to fail; exit 3)"
    assert "about to fail" in err.value.detail  # pyinfra's output of the step
    assert _leftovers(settings, name) == [] and name not in manager.templates()
    assert TemplateRegistry(settings.state_dir).get(name) is None


def _interrupted() -> None:
    raise KeyboardInterrupt  # what Ctrl-C raises in the builder's process, mid-step


def test_an_interrupted_build_leaves_nothing_behind(manager: Manager, settings: Settings) -> None:
    name = f"int-{RUN_ID}"
    with pytest.raises(KeyboardInterrupt):
        manager.build_template(Template().run("touch /made-before").deploy(_interrupted), name)
    assert _leftovers(settings, name) == [] and name not in manager.templates()


@pytest.mark.parametrize(
    ("command", "control"),
    [
        ("chmod u+s /usr/bin/python3.11", "SBX-ESC-05"),
        ("echo 'sandbox ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/agent", "SBX-USER-02"),
        ("echo 'PermitRootLogin yes' >> /etc/ssh/sshd_config", "SBX-SSH-01"),
        ("usermod -aG disk sandbox", "SBX-USER-01"),
    ],
)
def test_a_build_that_breaks_a_control_leaves_nothing(
    manager: Manager, settings: Settings, command: str, control: str
) -> None:
    name = f"ctl-{RUN_ID}"
    with pytest.raises(TemplateBuildError) as err:
        manager.build_template(Template().run(command), name)
    assert err.value.step == "hardening checks" and control in err.value.detail, str(err.value)
    assert _leftovers(settings, name) == [] and name not in manager.templates()


# -- by name -------------------------------------------------------------------------------------------
def test_the_cli_builds_lists_and_removes(settings: Settings, sources: Path, tmp_path: Path) -> None:
    definition_file = tmp_path / "tmpl.py"
    definition_file.write_text(
        "from sandbox_rt import Template\n"
        f"TOOLS = Template().copy({str(sources / 'app/run.sh')!r}, '/usr/local/bin/app').run('app > /ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_RT_")}
    env["SANDBOX_RT_STATE_DIR"] = str(settings.state_dir)
    cli = [sys.executable, "-m", "sandbox_rt"]
    name = f"cli-{RUN_ID}"
    run = subprocess.run(
        [*cli, "template", "build", f"{definition_file}:TOOLS", "--name", name],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0 and run.stdout.strip() == name, run.stderr
    assert "==> step 2/2 run(app > /ok)" in run.stderr  # progress on stderr
    listed = subprocess.run(
        [*cli, "--json", "template", "ls"], env=env, capture_output=True, text=True, timeout=60
    )
    assert name in json.loads(listed.stdout), listed.stderr
    bad = subprocess.run(
        [*cli, "template", "build", f"{definition_file}:NOPE"], env=env, capture_output=True, text=True
    )
    assert bad.returncode == 2 and "NOPE must be a sandbox_rt.Template" in bad.stderr
    removed = subprocess.run(
        [*cli, "template", "rm", name], env=env, capture_output=True, text=True, timeout=60
    )
    assert removed.returncode == 0, removed.stderr
    assert _leftovers(settings, name) == [] and name not in Manager(settings).templates()


def test_a_template_in_use_cannot_be_removed(
    manager: Manager, settings: Settings, built: tuple[BuildResult, list[str]]
) -> None:
    sb = _made_from(manager, NAME)
    try:
        with pytest.raises(StateConflict, match=f"in use by sandbox {sb.id}"):
            remove_template(manager, NAME)
        assert (settings.lxc_path / built[0].template.container).is_dir()
    finally:
        sb.destroy()
    with pytest.raises(ConfigError, match="default template"):
        manager.build_template(Template().run("true"), "default")
    t0 = time.monotonic()
    remove_template(manager, NAME)
    assert time.monotonic() - t0 < 30
    assert NAME not in manager.templates() and _leftovers(settings, NAME) == []
