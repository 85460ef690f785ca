"""One ``check_...`` function per control (or per part of one): each returns quietly when the control
holds and raises :class:`Violation` naming the control when it does not. The control tests call them
on real sandboxes; the negative proofs (test_proofs.py) call the same functions on a throw-away setup
with the protection removed and expect a Violation, so no check can pass vacuously.

Preconditions of a check (the probe target answers, the host reaches the lan, ...) are plain
``assert``s, never Violations: a broken test setup must not look like a working protection.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import errno as errno_module
import functools
import json
import re
import secrets
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import paramiko
import yaml
from testinfra.host import Host

import sandbox_rt
from sandbox_rt.backends.lxc.idmap import idmap_base_for
from sandbox_rt.backends.lxc.nft import NftInternetSet

from . import seccomp_filter
from .hosts import pinned_client
from .sites import Site, local_site
from .testnet import SimNet

REPO = Path(__file__).resolve().parents[2]
PROBE_SOURCE = Path(__file__).with_name("probe.py")
PROBE = "/tmp/.hardening-probe.py"
CGROUP = Path("/sys/fs/cgroup")
CGROUP_V1 = (CGROUP / "memory" / "memory.limit_in_bytes").exists()
LEASES = Path("/var/lib/sandbox_rt/dnsmasq/leases")
SANDBOX_UID = 1000  # the sandbox user (SBX-USER-01; sandbox_template_uid)
# Linux capability numbers (include/uapi/linux/capability.h) of the caps the template drops.
CAPS = {
    "chown": 0, "dac_override": 1, "dac_read_search": 2, "fowner": 3, "fsetid": 4, "kill": 5,
    "setgid": 6, "setuid": 7, "setpcap": 8, "linux_immutable": 9, "net_bind_service": 10,
    "net_broadcast": 11, "net_admin": 12, "net_raw": 13, "ipc_lock": 14, "ipc_owner": 15,
    "sys_module": 16, "sys_rawio": 17, "sys_chroot": 18, "sys_ptrace": 19, "sys_pacct": 20,
    "sys_admin": 21, "sys_boot": 22, "sys_nice": 23, "sys_resource": 24, "sys_time": 25,
    "sys_tty_config": 26, "mknod": 27, "lease": 28, "audit_write": 29, "audit_control": 30,
    "setfcap": 31, "mac_override": 32, "mac_admin": 33, "syslog": 34, "wake_alarm": 35,
    "block_suspend": 36, "audit_read": 37, "perfmon": 38, "bpf": 39, "checkpoint_restore": 40,
}  # fmt: skip


class Violation(AssertionError):
    """A control does not hold."""

    def __init__(self, control: str, message: str) -> None:
        super().__init__(f"{control} violated: {message}")
        self.control = control


def violated(control: str, message: str) -> NoReturn:
    raise Violation(control, message)


def require(control: str, ok: object, message: str) -> None:
    if not ok:
        violated(control, message)


# -- what the checks run against ------------------------------------------------------------------
@dataclasses.dataclass
class Target:
    """A sandbox and the ways into it: the runtime API, testinfra as the user (pinned SSH) and as
    container root (lxc-attach). ``container`` is its LXC container: the sandbox id on the embedded
    default, the test server engine's container or the CT's VMID (in the emulated PVE node) for a
    PVE-backed sandbox; ``site`` says where that container lives (None: this machine's LXC path)."""

    sb: sandbox_rt.Sandbox
    user: Host
    root: Host
    known_hosts: Path
    settings: sandbox_rt.Settings
    container: str = ""
    site: Site | None = None
    # root over the runtime's SSH (a sandbox made with root=True): run_root and the as_root checks
    # then run as what an agent holds there, not through lxc-attach
    root_login: bool = False

    @property
    def id(self) -> str:
        return self.sb.id

    @property
    def ct(self) -> str:
        return self.container or self.sb.id

    @property
    def ip(self) -> str:
        return self.sb.ip


def site_of(t: Target) -> Site:
    """Where ``t``'s container lives (a target made without a site: this machine's LXC path)."""
    return t.site if t.site is not None else local_site(t.settings)


def ct_config_values(t: Target, key: str) -> list[str]:
    """``key``'s values in the LXC config of ``t``'s container, wherever it lives."""
    site = site_of(t)
    return config_values(t.ct, key, site.lxc_dir)


@functools.cache
def role_defaults(role: str) -> dict[str, Any]:
    """The role's defaults over the shared host variables (roles/sandbox_host_vars), as the role sees them."""
    shared = yaml.safe_load((REPO / "roles" / "sandbox_host_vars" / "defaults" / "main.yml").read_text())
    own = yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text())
    return {**shared, **own}


def host_run(*cmd: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, check=False)


def run_user(t: Target, command: str, timeout: float = 30) -> sandbox_rt.ExecResult:
    return t.sb.exec(command, timeout=timeout)


def run_root(t: Target, command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    if t.root_login:
        r = t.sb.exec(["/bin/sh", "-c", command], timeout=timeout, user="root")
        return subprocess.CompletedProcess(["ssh", "root", command], r.exit_code, r.text, r.stderr_text)
    site = site_of(t)
    return site.run(
        "lxc-attach", "-P", site.lxc_path, "-n", t.ct, "--clear-env", "--", "/bin/sh", "-c", command,
        timeout=timeout,
    )  # fmt: skip


def _ensure_probe(t: Target) -> None:
    if run_user(t, f"test -s {PROBE}", timeout=10).exit_code != 0:
        t.sb.write_file(PROBE, PROBE_SOURCE.read_bytes())


def probe(t: Target, *args: object, timeout: float = 30) -> dict[str, Any]:
    """Run a probe (probe.py) in the sandbox as its user; its JSON answer."""
    _ensure_probe(t)
    r = t.sb.exec(["python3", PROBE, *map(str, args)], timeout=timeout)
    assert r.exit_code == 0, f"probe {args} failed: {r.stderr_text}"
    out: dict[str, Any] = json.loads(r.text.strip().splitlines()[-1])
    return out


def root_probe(t: Target, *args: object, timeout: float = 30) -> dict[str, Any]:
    """Run a probe as container root (raw sockets for ICMP)."""
    _ensure_probe(t)
    r = run_root(t, " ".join(["python3", PROBE, *map(str, args)]), timeout=timeout)
    assert r.returncode == 0, f"root probe {args} failed: {r.stderr}"
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def parallel(*calls: Callable[[], Any]) -> list[Any]:
    """Run independent probes at once (each blocked one waits out its timeout); results in order."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return [f.result() for f in [pool.submit(call) for call in calls]]


def sweep(t: Target, targets: Iterable[str], timeout: float = 1.5) -> set[tuple[str, int]]:
    res = probe(t, "sweep", timeout, *targets, timeout=timeout + 30)
    return {(h, int(p)) for h, p in res["open"]}


def init_pid(t: Target) -> int:
    """PID 1 of the sandbox, as this machine numbers it."""
    return site_of(t).init_pid(t.ct)


def proc_status(pid: int | str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def config_values(sandbox_id: str, key: str, lxc_path: Path) -> list[str]:
    out = []
    for line in (lxc_path / sandbox_id / "config").read_text().splitlines():
        k, sep, v = line.partition("=")
        if sep and k.strip() == key:
            out.append(v.strip())
    return out


def cgroup_dir(sandbox: Target | str, controller: str) -> Path:
    """The cgroup of a sandbox (a Target, wherever it runs; or a sandbox id on this machine)."""
    if isinstance(sandbox, Target):
        return site_of(sandbox).cgroup_dir(sandbox.ct, controller)
    group = f"lxc.payload.{sandbox}"
    return CGROUP / controller / group if CGROUP_V1 else CGROUP / group


def cgroup_read(sandbox: Target | str, controller: str, v1_file: str, v2_file: str) -> str:
    name = v1_file if CGROUP_V1 else v2_file
    return (cgroup_dir(sandbox, controller) / name).read_text().strip()


def sshd_settings(t: Target) -> dict[str, list[str]]:
    """``sshd -T`` (effective configuration for a sandbox login) as {key: [values]}."""
    r = t.root.run("/usr/sbin/sshd -T -C user=sandbox,host=probe,addr=10.99.0.1")
    assert r.rc == 0, f"sshd -T failed: {r.stderr}"
    out: dict[str, list[str]] = {}
    for line in r.stdout.splitlines():
        key, _, value = line.partition(" ")
        out.setdefault(key.lower(), []).append(value.strip())
    return out


def sshd_value(settings: dict[str, list[str]], key: str) -> str:
    return " ".join(settings.get(key, [""]))


# -- SBX-USER -------------------------------------------------------------------------------------
def check_user_unprivileged(t: Target) -> None:
    c = "SBX-USER-01"
    name = t.settings.ssh_user
    me = t.user.user()
    require(c, me.name == name and me.uid != 0, f"logged in as {me.name} uid {me.uid}")
    require(c, (me.uid, me.gid) == (1000, 1000), f"uid/gid {me.uid}/{me.gid}, not 1000/1000")
    require(c, me.groups == [name], f"{name} is in groups {me.groups}")
    cap_eff = t.user.run("grep CapEff /proc/self/status").stdout.split()[-1]
    require(c, int(cap_eff, 16) == 0, f"the user's shell has capabilities {cap_eff}")
    password = t.root.user(name).password
    require(c, password.startswith(("!", "*")), f"{name} has a usable password hash")
    home = t.root.file(f"/home/{name}")
    require(c, home.user == name and home.mode == 0o750, f"home {home.user} {oct(home.mode)}")


def check_no_sudo(t: Target) -> None:
    c = "SBX-USER-02"
    name = t.settings.ssh_user
    r = run_user(t, "sudo -n true", timeout=20)
    require(c, r.exit_code != 0, "`sudo -n true` succeeded as the sandbox user")
    if t.root.exists("sudo"):
        listing = t.root.run(f"sudo -n -l -U {name}").stdout
        require(c, "is not allowed to run sudo" in listing, f"sudo -l -U {name}: {listing.strip()}")
    sudoers = t.root.run("cat /etc/sudoers /etc/sudoers.d/* 2>/dev/null").stdout
    entries = [ln for ln in sudoers.splitlines() if re.match(rf"^\s*{name}\b", ln)]
    require(c, not entries, f"sudoers entries for {name}: {entries}")
    privileged = set(role_defaults("sandbox_template")["sandbox_template_privileged_groups"])
    groups = set(t.root.user(name).groups)
    require(c, not groups & privileged, f"{name} is in privileged groups {groups & privileged}")


def check_root_locked(t: Target) -> None:
    password = t.root.user("root").password
    require("SBX-USER-03", password.startswith(("*", "!")), "root has a usable password hash")


def check_authorized_keys(t: Target) -> None:
    """SBX-USER-04: sshd reads keys only from a root-owned file the sandbox user cannot change or
    replace (a ``command=`` in front of the runtime's key would capture every later connection)."""
    c = "SBX-USER-04"
    name = t.settings.ssh_user
    d = role_defaults("sandbox_template")
    keys_dir = d["sandbox_template_authorized_keys_dir"]
    runtime_key = Path(str(t.settings.ssh_key) + ".pub").read_text().split()[:2]
    configured = sshd_value(sshd_settings(t), "authorizedkeysfile")
    require(c, configured == f"{keys_dir}/%u", f"sshd AuthorizedKeysFile is {configured!r}")
    for path, mode in ((keys_dir, 0o755), (f"{keys_dir}/{name}", 0o644)):
        f = t.root.file(path)
        require(c, f.exists, f"{path} does not exist")
        owner = (f.user, f.group, f.mode)
        require(c, owner == ("root", "root", mode), f"{path} is {f.user}:{f.group} {oct(f.mode)}")
    keys = t.root.file(f"{keys_dir}/{name}")
    lines = [ln for ln in keys.content_string.splitlines() if ln.strip() and not ln.startswith("#")]
    require(c, len(lines) == 1, f"{len(lines)} keys authorized, expected only the runtime's")
    words = lines[0].split()
    require(c, words[1:3] == runtime_key, "the authorized key is not the runtime's")
    require(c, "restrict" in words[0].split(","), f"the key lacks `restrict`: {words[0]}")
    left = t.root.run(f"ls -d /home/{name}/.ssh/authorized_keys* /root/.ssh/authorized_keys* 2>/dev/null")
    require(c, not left.stdout.split(), f"key files in home directories: {left.stdout.split()}")
    check_keys_not_writable(t, f"{keys_dir}/{name}")
    check_own_key_ignored(t)


def check_keys_not_writable(t: Target, path: str) -> None:
    """The sandbox user can neither append to the key file nor replace it or add one beside it."""
    c = "SBX-USER-04"
    folder = path.rsplit("/", 1)[0]
    attempts = {
        "append to": f"echo 'command=\"/bin/true\" ssh-ed25519 AAAA' >> {path}",
        "replace": f"cp {path} /tmp/.hardening-k && mv -f /tmp/.hardening-k {path}",
        "add a file beside": f"touch {folder}/.hardening-probe",
    }
    done = [what for what, cmd in attempts.items() if run_user(t, cmd).exit_code == 0]
    run_root(t, f"rm -f {folder}/.hardening-probe")
    require(c, not done, f"the sandbox user could {', '.join(done)} {path}")


def check_own_key_ignored(t: Target) -> None:
    """A key the sandbox user puts into ~/.ssh/authorized_keys logs nobody in."""
    c = "SBX-USER-04"
    key = t.known_hosts.with_name(f"userkey.{t.id}")
    key.unlink(missing_ok=True)
    made = host_run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hardening", "-f", str(key))
    assert made.returncode == 0, made.stderr
    public = Path(str(key) + ".pub").read_text().strip()
    wrote = run_user(t, f"mkdir -p -m 700 ~/.ssh && echo '{public}' > ~/.ssh/authorized_keys")
    assert wrote.exit_code == 0, f"precondition: the user writes its own ~/.ssh ({wrote.stderr_text})"
    try:
        pinned_client(t.ip, t.settings.ssh_user, t.known_hosts, key).close()
    except paramiko.AuthenticationException:
        return
    finally:
        run_user(t, "rm -rf ~/.ssh")
    violated(c, "a key the sandbox user wrote into ~/.ssh/authorized_keys logged in")


# -- SBX-SSH --------------------------------------------------------------------------------------
def _connect(t: Target, user: str, **kwargs: Any) -> paramiko.SSHClient:
    key = None if "password" in kwargs else t.settings.ssh_key
    return pinned_client(t.ip, user, t.known_hosts, key, **kwargs)


def check_root_login_refused(t: Target) -> None:
    c = "SBX-SSH-01"
    require(c, sshd_value(sshd_settings(t), "permitrootlogin") == "no", "PermitRootLogin is not no")
    # what /sbin/sandbox-init writes only in a root=True sandbox (SBX-ESC-27) is not here
    for path in ("/etc/ssh/sshd_config.root", "/etc/ssh/authorized_keys/root"):
        require(c, not t.root.file(path).exists, f"{path} exists in a sandbox made without root")
    try:
        _connect(t, "root").close()
    except paramiko.AuthenticationException:
        return
    violated(c, "root logged in with the runtime's key")


def check_password_refused(t: Target) -> None:
    c = "SBX-SSH-02"
    try:
        _connect(t, t.settings.ssh_user, password="hardening-test-password").close()
    except paramiko.BadAuthenticationType as exc:
        require(c, exc.allowed_types == ["publickey"], f"sshd offers {exc.allowed_types}")
    except paramiko.AuthenticationException as exc:
        violated(c, f"sshd tried the password (and refused it: {exc}): password auth is on")
    else:
        violated(c, "a password login succeeded")
    cfg = sshd_settings(t)
    for key, want in (
        ("passwordauthentication", "no"),
        ("kbdinteractiveauthentication", "no"),
        ("permitemptypasswords", "no"),
        ("authenticationmethods", "publickey"),
    ):
        require(c, sshd_value(cfg, key) == want, f"sshd {key} is {sshd_value(cfg, key)!r}, not {want!r}")


def check_only_sandbox_user(t: Target) -> None:
    c = "SBX-SSH-03"
    allow = sshd_value(sshd_settings(t), "allowusers")
    require(c, allow == t.settings.ssh_user, f"AllowUsers is {allow!r}")
    try:
        _connect(t, "daemon").close()
    except paramiko.AuthenticationException:
        return
    violated(c, "user daemon logged in")


def check_no_forwarding(t: Target) -> None:
    c = "SBX-SSH-04"
    cfg = sshd_settings(t)
    for key in (
        "allowtcpforwarding",
        "allowstreamlocalforwarding",
        "x11forwarding",
        "allowagentforwarding",
        "permittunnel",
        "gatewayports",
        "permituserenvironment",
        "permituserrc",
    ):
        require(c, sshd_value(cfg, key) == "no", f"sshd {key} is {sshd_value(cfg, key)!r}")
    client = _connect(t, t.settings.ssh_user)
    try:
        transport = client.get_transport()
        assert transport is not None
        try:
            chan = transport.open_channel("direct-tcpip", ("127.0.0.1", 22), ("127.0.0.1", 40000), timeout=10)
        except paramiko.ChannelException:
            return
        chan.close()
        violated(c, "sshd opened a direct-tcpip (port forwarding) channel")
    finally:
        client.close()


def check_host_key(t: Target) -> None:
    c = "SBX-SSH-05"
    keys = sshd_settings(t).get("hostkey", [])
    require(c, keys == ["/etc/ssh/ssh_host_ed25519_key"], f"sshd host keys: {keys}")
    files = sorted(t.root.run("ls /etc/ssh").stdout.split())
    host_files = [f for f in files if f.startswith("ssh_host_")]
    require(
        c, host_files == ["ssh_host_ed25519_key", "ssh_host_ed25519_key.pub"], f"host key files {host_files}"
    )
    client = _connect(t, t.settings.ssh_user)
    try:
        transport = client.get_transport()
        assert transport is not None
        served = transport.get_remote_server_key()
        pinned = t.sb.record.host_key.split()
        require(c, [served.get_name(), served.get_base64()] == pinned[:2], "served host key != pinned key")
    finally:
        client.close()


def check_sshd_limits(t: Target) -> None:
    c = "SBX-SSH-06"
    d = role_defaults("sandbox_template")
    cfg = sshd_settings(t)
    want = {
        "maxsessions": str(d["sandbox_template_sshd_max_sessions"]),
        "maxstartups": str(d["sandbox_template_sshd_max_startups"]),
        "maxauthtries": str(d["sandbox_template_sshd_max_auth_tries"]),
        "logingracetime": str(d["sandbox_template_sshd_login_grace_time"]),
        "usedns": "no",
    }
    for key, value in want.items():
        require(c, sshd_value(cfg, key) == value, f"sshd {key} is {sshd_value(cfg, key)!r}, not {value!r}")


# -- SBX-LIM --------------------------------------------------------------------------------------
def _check_limit(t: Target, control: str, flag: str, soft: int, hard: int) -> None:
    out = t.user.run(f"ulimit -S{flag}; ulimit -H{flag}").stdout.split()
    require(control, out == [str(soft), str(hard)], f"ulimit -{flag} soft/hard {out}, not {soft}/{hard}")
    raise_hard = t.user.run(f"bash -c 'ulimit -H{flag} {hard + 1}'")
    require(control, raise_hard.rc != 0, f"the user raised the hard -{flag} limit")


def check_nproc(t: Target) -> None:
    d = role_defaults("sandbox_template")
    _check_limit(t, "SBX-LIM-01", "u", d["sandbox_template_nproc_soft"], d["sandbox_template_nproc_hard"])


def check_nofile(t: Target) -> None:
    d = role_defaults("sandbox_template")
    _check_limit(t, "SBX-LIM-02", "n", d["sandbox_template_nofile_soft"], d["sandbox_template_nofile_hard"])


def check_no_core_dumps(t: Target, host: Host) -> None:
    c = "SBX-LIM-03"
    out = t.user.run("ulimit -Sc; ulimit -Hc").stdout.split()
    require(c, out == ["0", "0"], f"core limit soft/hard {out}")
    require(c, t.user.run("bash -c 'ulimit -Sc 1'").rc != 0, "the user raised the core limit")
    crash = t.user.run(
        "cd /tmp && rm -f core core.*; bash -c 'kill -SEGV $$'; ls /tmp | grep -c '^core' || true"
    )
    require(c, crash.stdout.strip() == "0", "a crashing process left a core file")
    require(c, host.sysctl("fs.suid_dumpable") == 0, "host fs.suid_dumpable is not 0")
    pattern = str(host.file("/proc/sys/kernel/core_pattern").content_string.strip())
    require(
        c,
        not pattern.startswith("|") or "systemd-coredump" in pattern,
        f"host core_pattern pipes cores to {pattern!r}, which runs even with RLIMIT_CORE=0",
    )


# -- SBX-SVC / SBX-ID / SBX-INIT ------------------------------------------------------------------
def check_services_off(t: Target, template_rootfs: Path) -> None:
    c = "SBX-SVC-01"
    procs = [ln.split(None, 2) for ln in t.root.run("ps -eo pid=,ppid=,comm=").stdout.splitlines()]
    by_pid = {int(pid): (int(ppid), comm) for pid, ppid, comm in procs}
    require(c, by_pid.get(1, (0, ""))[1] == "tini", f"PID 1 is {by_pid.get(1)}")
    daemons = sorted(comm for pid, (ppid, comm) in by_pid.items() if ppid == 1)
    require(c, daemons == ["sshd"], f"PID 1 runs {daemons}, only sshd allowed")
    listening = t.root.run("ss -H -lntu").stdout.splitlines()
    local = sorted({ln.split()[4] for ln in listening})
    require(c, local == ["0.0.0.0:22"], f"listening sockets {local}")
    masked = role_defaults("sandbox_template")["sandbox_template_masked_units"]
    if (template_rootfs / "lib/systemd/systemd").exists():
        for unit in masked:
            link = t.root.file(f"/etc/systemd/system/{unit}")
            require(c, link.is_symlink and link.linked_to == "/dev/null", f"{unit} is not masked")


def clone_identities(a: Target, b: Target) -> dict[str, set[str]]:
    """The host keys and machine-ids two clones have."""
    keys = {x.user.file("/etc/ssh/ssh_host_ed25519_key.pub").content_string.split()[1] for x in (a, b)}
    ids = {x.user.file("/etc/machine-id").content_string.strip() for x in (a, b)}
    return {"keys": keys, "ids": ids}


def check_host_keys_unique(a: Target, b: Target, template_rootfs: Path) -> None:
    c = "SBX-ID-01"
    in_template = sorted(p.name for p in (template_rootfs / "etc/ssh").glob("ssh_host_*"))
    require(c, not in_template, f"host keys in the template: {in_template}")
    keys = clone_identities(a, b)["keys"]
    require(c, len(keys) == 2, "two clones serve the same host key")
    for x in (a, b):
        require(c, x.sb.record.host_key.split()[1] in keys, f"{x.id}'s pinned key is not the one it has")


def check_machine_ids_unique(a: Target, b: Target, template_rootfs: Path) -> None:
    c = "SBX-ID-02"
    template_id = (template_rootfs / "etc/machine-id").read_text().strip()
    require(c, template_id == "", f"the template has machine-id {template_id}")
    ids = clone_identities(a, b)["ids"]
    require(c, len(ids) == 2 and all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids), f"machine-ids {ids}")


def check_hostname(t: Target, template_rootfs: Path) -> None:
    c = "SBX-ID-03"
    name = t.user.run("hostname").stdout.strip()
    require(c, name == t.sb.hostname, f"hostname {name!r}, not {t.sb.hostname!r}")
    hosts = t.user.file("/etc/hosts").content_string
    require(
        c, re.search(rf"^{re.escape(t.ip)}\s+{re.escape(name)}\b", hosts, re.M), "/etc/hosts lacks its name"
    )
    baseline = (template_rootfs / "etc/hostname").read_text().strip()
    require(
        c, baseline == role_defaults("sandbox_template")["sandbox_template_hostname"], "template hostname"
    )


def _nameservers(text: str) -> list[str]:
    return [ln.split()[1] for ln in text.splitlines() if ln.startswith("nameserver")]


def check_resolver(t: Target, template_rootfs: Path) -> None:
    c = "SBX-ID-04"
    want = [t.settings.dns_server]
    got = _nameservers(t.user.file("/etc/resolv.conf").content_string)
    require(c, got == want, f"sandbox nameservers {got}")
    got = _nameservers((template_rootfs / "etc/resolv.conf").read_text())
    require(c, got == want, f"template nameservers {got}")


def check_init(t: Target) -> None:
    c = "SBX-INIT-01"
    cmdline = t.user.file("/proc/1/cmdline").content.split(b"\x00")
    require(c, cmdline[:5] == [b"/usr/bin/tini", b"--", b"/usr/sbin/sshd", b"-D", b"-e"], f"PID 1: {cmdline}")
    init = t.root.file("/sbin/sandbox-init")
    require(c, init.user == "root" and init.mode == 0o755, f"sandbox-init {init.user} {oct(init.mode)}")
    require(c, t.user.run("test -w /sbin/sandbox-init").rc != 0, "the user may write /sbin/sandbox-init")


# -- SBX-ACC --------------------------------------------------------------------------------------
def check_runtime_key_scoped(settings: sandbox_rt.Settings, host: Host) -> None:
    c = "SBX-ACC-01"
    key = host.file(str(settings.ssh_key))
    require(c, key.user == "root" and key.mode == 0o600, f"runtime key {key.user} {oct(key.mode)}")
    folder = host.file(str(settings.ssh_key.parent))
    require(c, folder.user == "root" and folder.mode & 0o077 == 0, f"key dir {oct(folder.mode)}")
    require(c, settings.ssh_user != "root", "the runtime logs in as root")


# Privileges that administer PVE itself: the runtime's token must hold none, anywhere.
PVE_ADMIN_PRIVILEGES = frozenset(
    {
        "Permissions.Modify", "User.Modify", "Group.Allocate", "Realm.Allocate", "Realm.AllocateUser",
        "Sys.Modify", "Sys.PowerMgmt", "Sys.Console", "Sys.Syslog", "Sys.Incoming", "Pool.Allocate",
        "Datastore.Allocate", "SDN.Allocate", "Mapping.Modify",
    }
)  # fmt: skip


def check_token_scoped(settings: sandbox_rt.Settings, admin: Any) -> None:
    """SBX-ACC-01 on PVE: the runtime's API token (privilege-separated) changes guests only in its
    pool, may only clone and read the template, only audit the datacenter (/), administers nothing;
    changing the template is refused with 403."""
    from proxmoxer.core import ResourceException

    c = "SBX-ACC-01"
    api: Any = getattr(sandbox_rt.Manager(settings).backend, "api")  # noqa: B009 (the PVE backend's)
    pool, template = f"/pool/{settings.pve_pool}", f"/vms/{settings.pve_template_vmid}"
    perms: dict[str, dict[str, int]] = api.access.permissions.get()
    # the pool's members as the admin sees them (the token may not audit its pool)
    members = {f"/vms/{m['vmid']}" for m in admin.pools(settings.pve_pool).get().get("members", [])}
    guests = api.cluster.resources.get(type="vm")
    assert "VM.Allocate" in perms.get(pool, {}), f"precondition: the token works in {pool} ({perms})"
    for path, privs in perms.items():
        admin = sorted(set(privs) & PVE_ADMIN_PRIVILEGES)
        require(c, not admin, f"the token holds {admin} on {path}")
        # PVE checks guest privileges on /vms/<vmid> (inherited from /vms, /, or the guest's pool: the
        # pool's members are listed with them); the role's VM.* on its storage and bridge paths reach
        # no guest
        changes = sorted(p for p in privs if p.startswith(("VM.Config", "VM.Allocate", "VM.PowerMgmt")))
        foreign = path in ("/", "/vms") or (path.startswith("/vms/") and path not in members)
        require(c, not (changes and foreign), f"the token may change guests on {path}: {changes}")
    require(c, set(perms.get("/", {})) <= {"Sys.Audit"}, f"the token's privileges on /: {perms.get('/')}")
    on_template = set(perms.get(template, {}))
    require(c, on_template <= {"VM.Clone", "VM.Audit"}, f"privileges on {template}: {on_template}")
    vmid = settings.pve_template_vmid
    node = next(str(r["node"]) for r in guests if r.get("vmid") == vmid)
    try:  # a wrong digest: were it allowed, the write would still fail (and change nothing)
        api.nodes(node).lxc(vmid).config.put(description="hardening", digest="0" * 40)
    except ResourceException as exc:
        require(c, exc.status_code == 403, f"changing the template failed, but not for permissions: {exc}")
        return
    violated(c, "the token changed the template's config")


# -- SBX-NET --------------------------------------------------------------------------------------
def check_bridge_ports(bridge: str, host: Host) -> None:
    c = "SBX-NET-01"
    info = json.loads(host.check_output(f"ip -j -d link show dev {bridge}"))[0]
    require(c, info["linkinfo"]["info_kind"] == "bridge", f"{bridge} is not a bridge")
    want_mac = role_defaults("sandbox_network").get("sandbox_network_bridge_mac")
    if isinstance(want_mac, str) and "{" not in want_mac:
        require(c, info["address"] == want_mac.lower(), f"bridge MAC {info['address']}")
    ports = json.loads(host.check_output(f"ip -j -d link show master {bridge}") or "[]")
    foreign = [p["ifname"] for p in ports if p.get("linkinfo", {}).get("info_kind") != "veth"]
    require(c, not foreign, f"{bridge} has ports that are not veths: {foreign}")


def nft_ruleset(host: Host) -> list[dict[str, Any]]:
    doc = json.loads(host.check_output("nft -j list ruleset"))
    items: list[dict[str, Any]] = doc["nftables"]
    return items


def check_firewall_loaded(host: Host, table: str, set_name: str, bridge: str) -> None:
    c = "SBX-NET-02"
    items = nft_ruleset(host)
    tables = {(i["table"]["family"], i["table"]["name"]) for i in items if "table" in i}
    require(c, ("inet", table) in tables and ("bridge", table) in tables, f"tables loaded: {sorted(tables)}")
    chains = {
        (i["chain"]["family"], i["chain"]["table"], i["chain"]["name"]): i["chain"]
        for i in items
        if "chain" in i
    }
    fwd = chains.get(("inet", table, "forward"), {})
    require(c, fwd.get("hook") == "forward" and fwd.get("policy") == "drop", f"forward chain {fwd}")
    inp = chains.get(("inet", table, "input"), {})
    require(c, inp.get("hook") == "input", f"input chain {inp}")
    bfwd = chains.get(("bridge", table, "forward"), {})
    require(c, bfwd.get("hook") == "forward", f"bridge forward chain {bfwd}")
    sets = {
        (i["set"]["table"], i["set"]["name"]) for i in items if "set" in i and i["set"]["family"] == "inet"
    }
    require(c, (table, set_name) in sets, f"set {set_name} missing")
    text = host.check_output(f"nft list table inet {table}")
    for rule in (f'iifname "{bridge}" counter', f'oifname "{bridge}" counter', "jump from_sandbox"):
        require(c, rule in text, f"rule {rule!r} missing from inet {table}")


def check_no_internet(t: Target, net: SimNet, nft: NftInternetSet) -> None:
    c = "SBX-NET-04"
    reached = sweep(t, [f"{net.wan_ip}:80,443", f"{net.public_web_ip}:80,443"])
    require(c, not reached, f"{t.ip} reached the internet: {sorted(reached)}")
    require(c, not nft.contains(t.ip), f"{t.ip} is in {nft.set_name}")


def check_internet_works(t: Target, net: SimNet) -> None:
    c = "SBX-NET-05"
    resolved = run_user(t, f"getent hosts {net.dns_name}", timeout=15).text.split()
    require(c, resolved[:1] == [net.public_web_ip], f"{net.dns_name} resolved to {resolved}")
    for addr, port in ((net.public_web_ip, 80), (net.wan_ip, 443)):
        r = probe(t, "http", addr, port)
        require(
            c, r["ok"] and r["body"] == net.http_body(addr, port), f"HTTP {addr}:{port} with internet: {r}"
        )


@contextlib.contextmanager
def held_connection(t: Target, net: SimNet) -> Iterator[Path]:
    """A long-lived echo connection from the sandbox to the wan (probe hold), logged in the sandbox."""
    _ensure_probe(t)
    log = f"/tmp/.hold-{time.monotonic_ns()}.log"
    run_user(t, f"nohup python3 {PROBE} hold {net.wan_ip} 80 {log} >/dev/null 2>&1 &", timeout=10)
    try:
        yield Path(log)
    finally:
        run_user(t, f"pkill -f 'probe.py hold' ; rm -f {log}", timeout=10)


def hold_log(t: Target, log: Path) -> list[str]:
    return run_user(t, f"cat {log} 2>/dev/null", timeout=10).text.splitlines()


def wait_hold(t: Target, log: Path, pred: Any, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        lines = hold_log(t, log)
        if pred(lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.2)


def check_internet_toggle(
    t: Target, net: SimNet, nft: NftInternetSet, open_connection_dies: bool = True
) -> None:
    """SBX-NET-05: off -> on (works) -> off (blocked, and an open connection dies). With
    ``open_connection_dies=False`` (a PVE waiver's statement) the open connection must survive."""
    c = "SBX-NET-05"
    check_no_internet(t, net, nft)
    t.sb.set_internet(True)
    require(c, nft.contains(t.ip), "set_internet(True) did not add the address to the set")
    check_internet_works(t, net)
    with held_connection(t, net) as log:
        lines = wait_hold(t, log, lambda ls: sum(" ok" in ln for ln in ls) >= 3, 10)
        assert sum(" ok" in ln for ln in lines) >= 3, f"the held connection never worked: {lines}"
        t.sb.set_internet(False)
        if open_connection_dies:
            lines = wait_hold(t, log, lambda ls: any("FAIL" in ln for ln in ls), 8)
            require(
                c,
                any("FAIL" in ln for ln in lines),
                f"the open connection survived set_internet(False): {lines[-3:]}",
            )
        else:  # the waiver's statement: it lives on (its next echoes still come back)
            seen = len(hold_log(t, log))
            lines = wait_hold(t, log, lambda ls: sum(" ok" in ln for ln in ls[seen:]) >= 3, 10)
            fresh = lines[seen:]
            assert sum(" ok" in ln for ln in fresh) >= 3 and not any("FAIL" in ln for ln in fresh), (
                f"the open connection died after set_internet(False) ({fresh[-3:]}): the waiver is stale"
            )
    try:
        check_no_internet(t, net, nft)
    except Violation as exc:
        violated(c, f"after set_internet(False): {exc}")


def check_only_allowed_ports(t: Target, net: SimNet, allowed: Iterable[int]) -> None:
    c = "SBX-NET-06"
    allowed = set(allowed)
    ports = ",".join(str(p) for p in net.wan_tcp_ports)
    reached = {p for _, p in sweep(t, [f"{net.wan_ip}:{ports}"])}
    assert reached & allowed, f"precondition: the sandbox has internet (reached {reached})"
    require(c, reached <= allowed, f"with internet, wan ports {sorted(reached - allowed)} are reachable")


def check_no_lan(t: Target, net: SimNet) -> None:
    c = "SBX-NET-07"
    ports = ",".join(str(p) for p in net.lan_tcp_ports)
    reached, ping = parallel(
        functools.partial(sweep, t, [f"{net.lan_ip}:{ports}"]),
        functools.partial(root_probe, t, "icmp", net.lan_ip, 1.5),
    )
    require(c, not reached, f"the sandbox reached the LAN: {sorted(reached)}")
    require(c, not ping["reply"], "the LAN answered a ping from container root")


def check_isolated(a: Target, b: Target) -> None:
    c = "SBX-NET-08"
    pairs = ((a, b), (b, a))
    reached = parallel(*[functools.partial(sweep, src, [f"{dst.ip}:22"]) for src, dst in pairs])
    pings = parallel(*[functools.partial(root_probe, src, "icmp", dst.ip, 1.5) for src, dst in pairs])
    for (src, dst), tcp, ping in zip(pairs, reached, pings, strict=True):
        require(c, not tcp, f"{src.ip} reached {dst.ip}:22")
        require(c, not ping["reply"], f"{dst.ip} answered a ping from {src.ip}")


def check_no_host_services(t: Target, gateway: str, ports: Iterable[int]) -> None:
    c = "SBX-NET-09"
    reached = sweep(t, [f"{gateway}:{','.join(str(p) for p in sorted(set(ports)))}"])
    require(c, not reached, f"host services reachable from the sandbox: {sorted(reached)}")


def check_no_metadata(t: Target, net: SimNet) -> None:
    c = "SBX-NET-10"
    r = probe(t, "http", net.metadata_ip, 80, 2)
    require(c, not r["ok"] and not r["body"], f"the metadata service answered: {r}")


def check_dns_only_via_host(t: Target, net: SimNet, internet: bool) -> None:
    c = "SBX-NET-11"
    host = t.settings.dns_server
    others = (net.wan_ip, net.public_resolver_ip)
    specs = [f"{srv}/{proto}" for srv in (host, *others) for proto in ("udp", "tcp")]
    answers = probe(t, "dns-many", net.dns_name, *specs)
    for proto in ("udp", "tcp"):
        via_host = answers[f"{host}/{proto}"]
        if internet:
            require(c, via_host == net.public_web_ip, f"host DNS ({proto}) with internet: {via_host}")
        else:
            require(c, via_host is None, f"host DNS ({proto}) answered without internet: {via_host}")
    direct = {s: a for s, a in answers.items() if not s.startswith(host + "/") and a is not None}
    require(c, not direct, f"other resolvers answered the sandbox: {direct}")


def check_dns_answers_only_the_list(
    t: Target, net: SimNet, allowed: tuple[str, str], outside: Iterable[str]
) -> None:
    """``t`` (internet off, egress list with names) asks the host's DNS for ``outside`` names first,
    then for ``allowed`` (name, its address): each outside name is answered at once by the host
    (REFUSED or NXDOMAIN) and never reaches the upstream resolver; the allowed name resolves,
    through the upstream."""
    c = "SBX-NET-18"
    host = t.settings.dns_server
    outside = list(outside)
    for name in outside:
        for proto in ("udp", "tcp"):
            r = probe(t, "dns", host, name, proto)
            require(
                c,
                r["error"] == "" and r["answer"] is None and r["rcode"] in (3, 5),
                f"{name} ({proto}), outside the list, was not refused by the host: {r}",
            )
    name, address = allowed
    r = probe(t, "dns", host, name, "udp")
    assert r["answer"] == address, f"precondition: the listed name {name} resolves: {r}"
    deadline = time.monotonic() + 10
    while name not in net.upstream_queries():  # the upstream logs in order: outside names came first
        assert time.monotonic() < deadline, f"precondition: {name} is in the upstream's log"
        time.sleep(0.05)
    leaked = [name for name in outside if name in net.upstream_queries()]
    require(c, not leaked, f"names outside the sandbox's list left the host: {leaked}")


def check_no_ipv6(t: Target, host: Host, bridge: str) -> None:
    c = "SBX-NET-12"
    require(c, host.sysctl(f"net.ipv6.conf.{bridge}.disable_ipv6") == 1, f"IPv6 is on on {bridge}")
    fwd = host.check_output(f"nft list chain inet {t.settings.nft_table} forward")
    for direction in ("iifname", "oifname"):
        require(
            c,
            re.search(rf'meta nfproto ipv6 {direction} "{bridge}" .*drop', fwd),
            f"no IPv6 {direction} drop",
        )
    addrs = t.user.run("ip -6 -o addr show scope global").stdout.strip()
    require(c, not addrs, f"the sandbox has global IPv6 addresses: {addrs}")
    routes = t.user.run("ip -6 route show default").stdout.strip()
    require(c, not routes, f"the sandbox has an IPv6 default route: {routes}")
    r = probe(t, "tcp", "2001:db8::1", 80, 2)
    require(c, not r["open"], "an IPv6 connection left the sandbox")
    added = run_root(
        t, "ip -6 addr add 2001:db8:99::5/64 dev eth0 && ip -6 route add default via fe80::1 dev eth0"
    )
    require(c, added.returncode != 0, "container root configured IPv6 on eth0")


def check_no_spoofing(a: Target, b: Target, net: SimNet) -> None:
    """Container root in ``a`` (no internet) forges a SYN from ``b``'s address (``b`` has internet)."""
    c = "SBX-NET-15"
    sport = 40000 + secrets.randbelow(20000)
    sent = root_probe(a, "spoof", b.ip, net.wan_ip, 80, sport)
    if not sent["sent"]:  # no raw sockets in the sandbox at all: nothing can be forged
        require(c, "Operation not permitted" in str(sent["error"]), f"spoof probe failed: {sent}")
        return
    time.sleep(0.3)
    flows = net.host_conntrack("-s", b.ip, "-p", "tcp", "--sport", str(sport)).strip()
    require(c, not flows, f"{a.ip} sent a packet as {b.ip} and the host forwarded it: {flows}")


def check_rate_limited(t: Target, net: SimNet, rate: int, attempts: int = 200) -> int:
    c = "SBX-NET-13"
    r = probe(t, "burst", net.wan_ip, 80, attempts, 0.9, timeout=60)
    connected = int(r["connected"])
    assert connected >= 1, f"precondition: the sandbox has internet ({r})"
    # nft's limit: `rate`/s plus a burst of 5; a little slack for timing
    require(c, connected <= rate + 15, f"{connected} of {attempts} connections in 0.9 s (limit {rate}/s)")
    return connected


def check_sweep(t: Target, targets: Iterable[str], allowed: set[tuple[str, int]]) -> None:
    c = "SBX-NET-14"
    found = sweep(t, targets, timeout=3)
    require(c, found <= allowed, f"the scan found {sorted(found - allowed)}")


# -- SBX-RES --------------------------------------------------------------------------------------
def check_pids_fenced(t: Target, limit: int) -> None:
    c = "SBX-RES-01"
    value = cgroup_read(t, "pids", "pids.max", "pids.max")
    require(c, value != "max" and int(value) <= limit, f"pids.max is {value}, expected <= {limit}")


def check_memory_limited(t: Target, memory_mb: int) -> None:
    c = "SBX-RES-02"
    value = int(cgroup_read(t, "memory", "memory.limit_in_bytes", "memory.max"))
    require(c, value <= memory_mb << 20, f"memory limit {value} > {memory_mb} MB")


def check_no_swap(t: Target) -> None:
    c = "SBX-RES-03"
    if CGROUP_V1:
        mem = cgroup_read(t, "memory", "memory.limit_in_bytes", "")
        memsw = cgroup_read(t, "memory", "memory.memsw.limit_in_bytes", "")
        require(c, memsw == mem, f"memory+swap {memsw} != memory {mem}: the sandbox may swap")
    else:
        swap = cgroup_read(t, "memory", "", "memory.swap.max")
        require(c, swap == "0", f"memory.swap.max is {swap}")


def cpu_seconds(sandbox: Target | str) -> float:
    if CGROUP_V1:
        return int(cgroup_read(sandbox, "cpuacct", "cpuacct.usage", "")) / 1e9
    for line in cgroup_read(sandbox, "cpu", "", "cpu.stat").splitlines():
        if line.startswith("usage_usec"):
            return int(line.split()[1]) / 1e6
    raise AssertionError("no usage_usec in cpu.stat")


def check_cpu_quota(t: Target, cpus: float, seconds: float = 3.0) -> float:
    """Two busy loops for ``seconds``; the CPU-seconds per second the cgroup got."""
    c = "SBX-RES-04"
    before, t0 = cpu_seconds(t), time.monotonic()
    run_user(t, f"timeout {seconds} sh -c 'yes >/dev/null & yes >/dev/null & wait'", timeout=seconds + 30)
    used, wall = cpu_seconds(t) - before, time.monotonic() - t0
    ratio = used / wall
    assert ratio > cpus * 0.5, f"precondition: the hog ran ({ratio:.2f} CPU/s)"
    require(c, ratio <= cpus + 0.1, f"{ratio:.2f} CPU-seconds per second with cpus={cpus}")
    return ratio


def check_disk_bounded(t: Target, disk_gb: int) -> None:
    c = "SBX-RES-05"
    fill = "/home/sandbox/.fill"
    r = run_user(t, f"fallocate -l {disk_gb * 512}M {fill}; rc=$?; rm -f {fill}; exit $rc", timeout=60)
    require(c, r.exit_code == 0, f"could not even write half of disk_gb={disk_gb} GiB: {r.stderr_text!r}")
    r = run_user(t, f"fallocate -l {disk_gb * 1024 + 100}M {fill}; rc=$?; rm -f {fill}; exit $rc", timeout=60)
    require(c, r.exit_code != 0, f"wrote more than disk_gb={disk_gb} GiB")
    why = r.stderr_text.lower()
    require(c, "quota" in why or "space" in why, f"failed for another reason: {r.stderr_text!r}")


# -- functional resource attacks (SBX-RES-01/02) --------------------------------------------------
def _mem_available_kb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    raise AssertionError("no MemAvailable in /proc/meminfo")


class Sampler:
    """Calls ``read`` every ``interval`` seconds in a thread while the block runs; keeps the values."""

    def __init__(self, read: Callable[[], int], interval: float = 0.05) -> None:
        self.read, self.interval, self.values = read, interval, [read()]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.values.append(self.read())
            except (OSError, ValueError):
                return

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _events(t: Target, controller: str, v1_file: str, v2_file: str, key: str) -> int:
    for line in cgroup_read(t, controller, v1_file, v2_file).splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


def _alive(t: Target) -> bool:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if t.sb.exec("echo alive", timeout=10).stdout == b"alive\n":
                return True
        except Exception:
            time.sleep(0.5)
    return False


def check_fork_bomb_contained(t: Target, limit: int, by_pids_limit: bool = True) -> None:
    """SBX-RES-01: a bounded fork bomb hits the pids limit; the host forks on; the sandbox lives.
    ``by_pids_limit=False``: the login's nproc limit (SBX-LIM-01) stops it below ``limit`` first."""
    c = "SBX-RES-01"
    check_pids_fenced(t, limit)
    fired_before = _events(t, "pids", "pids.events", "pids.events", "max")
    pids = cgroup_dir(t, "pids") / "pids.current"
    host_forks: list[float] = []
    with Sampler(lambda: int(pids.read_text())) as sampled:
        # bounded: the bomb's first bash returns at once and its children outlive any `timeout`,
        # so it runs in a session of its own, KILLed as one group (atomic against fork) after
        # 10 s; the shell then polls with builtins until the group is reaped
        bomb = threading.Thread(
            target=lambda: t.sb.exec(
                "sleep 10 & timer=$!; setsid bash -c ':(){ :|:& };:' & bomb=$!; wait $timer; "
                "kill -KILL -- -$bomb; while kill -0 -- -$bomb 2>/dev/null; do :; done",
                timeout=60,
            )
        )
        bomb.start()
        deadline = time.monotonic() + 8
        nproc = int(role_defaults("sandbox_template")["sandbox_template_nproc_soft"])
        while (
            _events(t, "pids", "pids.events", "pids.events", "max") == fired_before
            if by_pids_limit
            else max(sampled.values) < nproc * 3 // 4  # the bomb multiplied up to the nproc limit
        ):
            assert time.monotonic() < deadline, "precondition: the bomb reached its limit"
            time.sleep(0.05)
        for _ in range(20):  # the host still forks, at once
            t0 = time.monotonic()
            assert subprocess.run(["/bin/true"], check=False).returncode == 0
            host_forks.append(time.monotonic() - t0)
        bomb.join(timeout=60)
    fired = _events(t, "pids", "pids.events", "pids.events", "max") - fired_before
    assert fired > 0 or not by_pids_limit, "precondition: the bomb reached the pids limit"
    require(c, max(sampled.values) <= limit, f"{max(sampled.values)} pids > limit {limit}")
    require(c, max(host_forks) < 1.0, f"host fork took {max(host_forks):.2f} s")
    require(c, _alive(t), "the sandbox did not survive the fork bomb")


def check_oom_contained(t: Target, memory_mb: int) -> None:
    """SBX-RES-02: 1 GiB asked for in a smaller sandbox is OOM-killed inside; the host barely notices."""
    c = "SBX-RES-02"
    check_memory_limited(t, memory_mb)
    kills_before = _events(t, "memory", "memory.oom_control", "memory.events", "oom_kill")
    with Sampler(_mem_available_kb) as host_mem:
        r = t.sb.exec("python3 -c 'b = bytearray(1 << 30); print(len(b))'", timeout=90)
    killed = r.exit_code == 137 and b"1073741824" not in r.stdout
    require(c, killed, f"1 GiB allocated in a {memory_mb} MB sandbox: {r}")
    kills = _events(t, "memory", "memory.oom_control", "memory.events", "oom_kill") - kills_before
    require(c, kills >= 1, "no OOM kill in the sandbox's cgroup")
    peak = int(cgroup_read(t, "memory", "memory.max_usage_in_bytes", "memory.peak"))
    require(c, peak <= memory_mb << 20, f"the sandbox used {peak >> 20} MB, over its {memory_mb} MB")
    # coarse (other work on this host moves it too): far less than the 1 GiB asked for left the host
    drop_mb = (host_mem.values[0] - min(host_mem.values)) / 1024
    require(c, drop_mb < 768, f"host available memory dropped {drop_mb:.0f} MB")
    require(c, _alive(t), "the sandbox did not survive the OOM kill")


# -- SBX-ESC --------------------------------------------------------------------------------------
def check_unprivileged(t: Target) -> None:
    c = "SBX-ESC-01"
    s = t.settings
    # the embedded default gives each sandbox a range of its own (isolated id maps, derived from its
    # address); a PVE CT has PVE's one map (the template's)
    isolated = t.sb.record.backend == "lxc" and s.idmap_isolated
    base = idmap_base_for(t.ip, s.ip_pool_start, s.idmap_base) if isolated else s.idmap_base
    require(c, base >= s.idmap_base >= 65536, f"container root would be host uid {base}")
    maps = ct_config_values(t, "lxc.idmap")
    want = [f"u 0 {base} {s.idmap_size}", f"g 0 {base} {s.idmap_size}"]
    require(c, sorted(maps) == sorted(want), f"lxc.idmap {maps}")
    # PID 1 is container root only in a sandbox made with root=True, or on PVE (SBX-ESC-28's waiver);
    # otherwise the sandbox user: either way a host uid of the container's range, never the host's own
    uids = proc_status(init_pid(t))["Uid"].split()
    pid1 = base if t.sb.root or site_of(t).is_pve else base + SANDBOX_UID
    require(c, set(uids) == {str(pid1)}, f"PID 1 runs as host uid {uids}, not {pid1}")
    uid_map = t.user.file("/proc/self/uid_map").content_string.split()
    require(c, uid_map == ["0", str(base), str(s.idmap_size)], f"uid_map {uid_map}")


def _attempts(t: Target, commands: list[str], as_root: bool) -> list[str]:
    """The commands that succeeded (each must fail)."""
    succeeded = []
    for cmd in commands:
        rc = run_root(t, cmd).returncode if as_root else run_user(t, cmd).exit_code
        if rc == 0:
            succeeded.append(cmd)
    return succeeded


def host_root_device() -> str:
    return host_run("findmnt", "-no", "SOURCE", "-T", "/").stdout.strip() or "/dev/vda"


def check_no_mounts(t: Target) -> None:
    c = "SBX-ESC-02"
    dev = host_root_device()
    cmds = [
        "mkdir -p /tmp/m && mount -t tmpfs none /tmp/m",
        "mkdir -p /tmp/m && mount --bind / /tmp/m",
        "mkdir -p /tmp/m && mount -t proc proc /tmp/m",
        f"mkdir -p /tmp/m && mount {dev} /tmp/m",
        "mkdir -p /tmp/m && mount -t sysfs sys /tmp/m",
    ]
    for as_root in (False, True):
        ok = _attempts(t, cmds, as_root)
        require(c, not ok, f"mounts succeeded as {'container root' if as_root else 'the user'}: {ok}")
    mounts = t.user.file("/proc/self/mounts").content_string
    require(c, not re.search(rf"^{re.escape(dev)}\s", mounts, re.M), f"the host's {dev} is mounted inside")


def check_no_kmsg(t: Target, host: Host) -> None:
    c = "SBX-ESC-03"
    require(c, not t.root.file("/dev/kmsg").exists, "/dev/kmsg exists")
    cmds = ["dmesg >/dev/null", "head -c1 /proc/kmsg >/dev/null", "head -c1 /dev/kmsg >/dev/null"]
    for as_root in (False, True):
        ok = _attempts(t, cmds, as_root)
        require(c, not ok, f"kernel log readable as {'root' if as_root else 'user'}: {ok}")
    require(c, host.sysctl("kernel.dmesg_restrict") == 1, "host kernel.dmesg_restrict is not 1")


def check_no_block_devices(t: Target) -> None:
    c = "SBX-ESC-04"
    found = t.root.run("find /dev -type b").stdout.split()
    require(c, not found, f"block devices in /dev: {found}")
    ok = _attempts(t, ["mknod /tmp/.blk b 8 0", "mknod /tmp/.blk2 b 253 0"], True)
    run_root(t, "rm -f /tmp/.blk /tmp/.blk2")
    require(c, not ok, f"container root made block devices: {ok}")
    if CGROUP_V1:
        rules = (cgroup_dir(t, "devices") / "devices.list").read_text().split("\n")
        bad = [r for r in rules if r.startswith(("a ", "b ")) and set(r.split()[-1]) & set("rw")]
        require(c, not bad, f"the devices cgroup allows {bad}")
    else:
        deny = ct_config_values(t, "lxc.cgroup2.devices.deny")
        require(c, "a" in deny, "no lxc.cgroup2.devices.deny = a")


def check_no_setuid_shells(t: Target) -> None:
    c = "SBX-ESC-05"
    names = role_defaults("sandbox_template")["sandbox_template_no_setuid"]
    found = t.root.run("find / -xdev -type f -perm /6000 2>/dev/null").stdout.split()
    pattern = re.compile(r".*/(" + "|".join(map(re.escape, names)) + r")[0-9.]*$")
    bad = [f for f in found if pattern.match(f)]
    require(c, not bad, f"setuid/setgid shells or interpreters: {bad}")


def check_proc_sys_readonly(t: Target) -> None:
    c = "SBX-ESC-06"
    cmds = [
        "echo hacked > /proc/sys/kernel/hostname",
        "echo 3 > /proc/sys/vm/drop_caches",
        "echo 1 > /proc/sys/net/ipv4/ip_forward",
        "echo 0 > /proc/sys/kernel/dmesg_restrict",
        "echo b > /proc/sysrq-trigger",
        "echo 1 > /sys/kernel/mm/ksm/run",
        "echo 1 > /sys/module/printk/parameters/time",
    ]
    for as_root in (False, True):
        ok = _attempts(t, cmds, as_root)
        require(c, not ok, f"writes succeeded as {'container root' if as_root else 'the user'}: {ok}")


def check_no_modules(t: Target) -> None:
    """SBX-ESC-07: the filter refuses the module calls (user and container root); no CAP_SYS_MODULE."""
    c = "SBX-ESC-07"
    check_refused(t, "module")
    got = kernel_probe(t, "module", as_root=True)["module"]
    bad = {call: r for call, r in got.items() if (r["ret"], r["errno"]) != (-1, EPERM)}
    require(c, not bad, f"module calls as container root: {bad}")
    bnd = int(proc_status(init_pid(t))["CapBnd"], 16)
    require(c, not bnd & (1 << CAPS["sys_module"]), "CAP_SYS_MODULE is in PID 1's bounding set")


def check_no_user_namespaces(t: Target) -> None:
    """SBX-ESC-08: no user namespace can be made, as the user or container root: ``unshare -Ur``
    fails, and the filter answers unshare/clone with CLONE_NEWUSER (EPERM) and clone3 (ENOSYS,
    so libc falls back to clone), while clone without namespace flags (fork, threads) passes."""
    c = "SBX-ESC-08"
    for as_root in (False, True):
        r = _attempts(t, ["unshare -Ur true", "unshare -U true"], as_root)
        require(c, not r, f"{r} succeeded as {'container root' if as_root else 'the sandbox user'}")
    check_refused(t, "userns")
    programs = seccomp_filter.loaded_filters(init_pid(t))
    fork = seccomp_filter.verdict(programs, NR_CLONE, [CLONE_FORK_FLAGS])
    require(c, fork.action == "allow", f"the filter answers a plain fork (clone) with {fork}")


def check_host_proc_hidden(t: Target, marker: str, marker_pid: int) -> None:
    c = "SBX-ESC-09"
    for who in (t.user, t.root):
        # "[x]yz" does not match grep's own command line
        seen = who.run(f"grep -l '[{marker[0]}]{marker[1:]}' /proc/[0-9]*/cmdline 2>/dev/null").stdout.split()
        require(c, not seen, f"a host process is visible inside: {seen}")
    pid1 = t.user.file("/proc/1/cmdline").content.split(b"\x00")[0]
    require(c, pid1 == b"/usr/bin/tini", f"/proc/1 is {pid1!r}, not the sandbox's init")
    same_pid = t.root.run(f"cat /proc/{marker_pid}/cmdline 2>/dev/null").stdout
    require(c, marker not in same_pid, f"the host's pid {marker_pid} shows the marker inside")
    count = len(t.root.run("ls -d /proc/[0-9]*").stdout.split())
    require(c, count < 50, f"{count} processes visible")


def check_caps_dropped(t: Target) -> None:
    c = "SBX-ESC-10"
    want = set(role_defaults("template_build")["template_build_cap_drop"])
    configured = set(" ".join(ct_config_values(t, "lxc.cap.drop")).split())
    require(c, want <= configured, f"lxc.cap.drop lacks {sorted(want - configured)}")
    bnd = int(proc_status(init_pid(t))["CapBnd"], 16)
    kept = sorted(cap for cap in want if bnd & (1 << CAPS[cap]))
    require(c, not kept, f"PID 1 keeps {kept}")
    eff = int(t.user.run("grep CapEff /proc/self/status").stdout.split()[-1], 16)
    require(c, eff == 0, f"the user has capabilities {eff:x}")


def check_seccomp(t: Target) -> None:
    """SBX-ESC-11: the sandbox runs under our profile (the role's file, installed where the config
    says), PID 1 and the user's processes are filtered, and the filter the kernel holds is ours:
    it answers umount2 with bad flags with EPERM (the kernel alone: EINVAL; LXC's stock profile
    allows umount2 and answers MNT_FORCE with EACCES)."""
    c = "SBX-ESC-11"
    require(c, proc_status(init_pid(t)).get("Seccomp") == "2", "PID 1 is not seccomp-filtered")
    mode = run_user(t, "grep '^Seccomp:' /proc/self/status").text.split()[-1:]
    require(c, mode == ["2"], f"user processes have Seccomp {mode}")
    programs = seccomp_filter.loaded_filters(init_pid(t))
    umount = seccomp_filter.verdict(programs, NR_UMOUNT2, [0, 0x80000000])
    refused = umount == seccomp_filter.Verdict("errno", EPERM)
    require(c, refused, f"the loaded filter answers umount2 with {umount}")
    d = role_defaults("template_build")
    want = d["template_build_seccomp_profile"]
    profile = ct_config_values(t, "lxc.seccomp.profile")
    require(c, profile == [want], f"lxc.seccomp.profile is {profile}, not {want}")
    shipped = (REPO / "roles" / "template_build" / "files" / d["template_build_seccomp_source"]).read_bytes()
    require(c, site_of(t).path(want).read_bytes() == shipped, f"{want} differs from the role's profile")


# -- SBX-ESC: the kernel surface (seccomp families, the userns lock, no_new_privs) ----------------
KERNEL_PROBE_SOURCE = Path(__file__).with_name("kernel_probe.py")
KERNEL_PROBE = "/tmp/.hardening-kernel-probe.py"
EPERM, ENOSYS = 1, 38
NR_CLONE, NR_UMOUNT2 = 56, 166
CLONE_FORK_FLAGS = 0x01200011  # glibc's fork: CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD
# kernel_probe.py family -> the control that holds it
FAMILY_CONTROLS = {
    "userns": "SBX-ESC-08",
    "module": "SBX-ESC-07",
    "setns": "SBX-ESC-15",
    "keyring": "SBX-ESC-16",
    "io_uring": "SBX-ESC-17",
    "userfaultfd": "SBX-ESC-18",
    "bpf": "SBX-ESC-19",
    "perf_event_open": "SBX-ESC-20",
    "mount": "SBX-ESC-21",
    "clock": "SBX-ESC-22",
    "ptrace": "SBX-ESC-23",
    "reboot": "SBX-ESC-24",
    "admin": "SBX-ESC-25",
}
# the filter's answer where it is not EPERM (moby's profile answers clone3 the same way)
FILTER_ERRNO = {"clone3(CLONE_NEWUSER)": ENOSYS, "clone3()": ENOSYS}


def kernel_probe(t: Target, *families: str, as_root: bool = False) -> dict[str, Any]:
    """Run kernel_probe.py in the sandbox, as its user (SSH) or as container root (lxc-attach)."""
    if run_user(t, f"test -s {KERNEL_PROBE}", timeout=10).exit_code != 0:
        t.sb.write_file(KERNEL_PROBE, KERNEL_PROBE_SOURCE.read_bytes())
    if as_root:
        r = run_root(t, " ".join(["python3", KERNEL_PROBE, *families]), timeout=60)
        assert r.returncode == 0, f"kernel probe {families} as root failed: {r.stderr}"
        text = r.stdout
    else:
        res = t.sb.exec(["python3", KERNEL_PROBE, *families], timeout=60)
        assert res.exit_code == 0, f"kernel probe {families} failed: {res.stderr_text}"
        text = res.text
    out: dict[str, Any] = json.loads(text.strip().splitlines()[-1])
    assert "error" not in out, f"kernel probe: {out['error']}"
    return out


def _errname(value: int) -> str:
    return errno_module.errorcode.get(value, str(value))


def check_refused(t: Target, *families: str, as_root: bool = False) -> None:
    """Every call of ``families`` made as the sandbox user (``as_root``: as container root, see
    :func:`run_root`) gets the filter's errno, and the filter the kernel holds for this sandbox
    answers exactly that call (same number, same arguments) with that errno: the refusal is the
    filter's, not the kernel's own permission check. One probe run for all the families."""
    who = "container root" if as_root else "the sandbox user"
    got = kernel_probe(t, *families, as_root=as_root)
    programs = seccomp_filter.loaded_filters(init_pid(t))
    filters = got["filters"]
    for family in families:
        c = FAMILY_CONTROLS[family]
        require(c, filters == len(programs), f"{who} runs under {filters} filters, PID 1 {len(programs)}")
        for call, r in got[family].items():
            assert "error" not in r, f"kernel probe {call}: {r['error']}"
            want = FILTER_ERRNO.get(call, EPERM)
            require(
                c,
                (r["ret"], r["errno"]) == (-1, want),
                f"{call} as {who} returned {r['ret']} ({_errname(r['errno'])}), "
                f"not the filter's {_errname(want)}",
            )
            verdict = seccomp_filter.verdict(programs, r["nr"], r["args"])
            require(
                c,
                verdict == seccomp_filter.Verdict("errno", want),
                f"the sandbox's seccomp filter answers {call} with {verdict}, not errno {_errname(want)}: "
                "the refusal is not the filter's",
            )


def check_userns_lock(t: Target) -> None:
    """SBX-ESC-14: the second lock: user.max_user_namespaces is 0 in the sandbox's user namespace
    (set by the start-host hook), and neither the user nor container root can raise it."""
    c = "SBX-ESC-14"
    knob = "/proc/sys/user/max_user_namespaces"
    value = run_user(t, f"cat {knob}").text.strip()
    require(c, value == "0", f"{knob} is {value!r} inside the sandbox")
    raised = _attempts(t, [f"echo 1000 > {knob}"], False) + _attempts(t, [f"echo 1000 > {knob}"], True)
    require(c, not raised, "the user or container root raised user.max_user_namespaces")
    after = run_root(t, f"cat {knob}").stdout.strip()
    require(c, after == "0", f"{knob} is {after!r} after the attempts")
    d = role_defaults("template_build")
    if site_of(t).is_pve:  # pve-container refuses lxc.hook.start-host: the template's raw mount hook
        key, want = "lxc.hook.mount", d["template_build_proxmox_ct_hook"]
    else:
        key, want = "lxc.hook.start-host", d["template_build_userns_lock_hook"]
    hook = ct_config_values(t, key)
    require(c, want in hook, f"{key} is {hook}, not {want}")


def check_no_new_privs(t: Target) -> None:
    """SBX-ESC-26: lxc.no_new_privs: a setuid binary runs without its owner's rights (setuid-root
    sudo stops at the flag, before any policy check); PID 1 and the user's shell carry NoNewPrivs."""
    c = "SBX-ESC-26"
    assert run_root(t, "test -u /usr/bin/sudo").returncode == 0, "precondition: sudo is setuid root"
    r = run_user(t, "sudo -n true", timeout=20)
    require(c, r.exit_code != 0, "`sudo -n true` succeeded")
    said = r.stderr_text.strip()
    require(c, "no new privileges" in said, f"sudo ran as root (it got to: {said!r})")
    mine = run_user(t, "grep '^NoNewPrivs:' /proc/self/status").text.split()[-1:]
    require(c, mine == ["1"], f"the user's shell has NoNewPrivs {mine}")
    require(c, proc_status(init_pid(t)).get("NoNewPrivs") == "1", "PID 1 lacks NoNewPrivs")
    nnp = ct_config_values(t, "lxc.no_new_privs")
    if site_of(t).is_pve:  # pve-container refuses the key: PID 1 (sandbox-init) sets the flag
        init = t.root.file("/sbin/sandbox-init").content_string
        require(c, "--no-new-privs" in init, "/sbin/sandbox-init does not set no_new_privs")
    else:
        require(c, nnp == ["1"], f"lxc.no_new_privs is {nnp}")


def check_no_nesting(t: Target) -> None:
    c = "SBX-ESC-12"
    cfg = site_of(t).config_file(t.ct).read_text()
    require(c, "nesting.conf" not in cfg, "the config includes nesting.conf")
    auto = " ".join(ct_config_values(t, "lxc.mount.auto")).split()
    rw = [
        a for a in auto if a in ("proc:rw", "sys:rw", "cgroup:rw", "cgroup-full:rw") or a in ("proc", "sys")
    ]
    require(c, not rw, f"lxc.mount.auto mounts {rw} read-write")
    limit_files = ["/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]
    if not CGROUP_V1:
        limit_files = ["/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/memory.max"]
    ok = _attempts(t, [f"echo 999999999 > {f}" for f in limit_files], True)
    require(c, not ok, f"container root changed its own limits: {ok}")
    ok = _attempts(
        t,
        ["unshare -m sh -c 'mount -t proc proc /proc'", "unshare -m sh -c 'mount -t cgroup2 none /mnt'"],
        True,
    )
    require(c, not ok, f"container root mounted: {ok}")


def check_apparmor_confined(t: Target) -> None:
    c = "SBX-ESC-13"
    label = Path(f"/proc/{init_pid(t)}/attr/current").read_text().strip()
    require(c, label.startswith("lxc-container-default-cgns"), f"PID 1's AppArmor label is {label!r}")


# -- SBX-LIFE -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Footprint:
    """What a sandbox puts on the host (taken before destroy, compared after)."""

    id: str
    ip: str
    port: str
    mac: str
    lxc_path: Path

    @classmethod
    def of(cls, sandbox_id: str, lxc_path: Path) -> Footprint:
        def one(key: str) -> str:
            values = config_values(sandbox_id, key, lxc_path)
            return values[-1] if values else ""

        return cls(
            sandbox_id,
            one("lxc.net.0.ipv4.address").split("/")[0],
            one("lxc.net.0.veth.pair"),
            one("lxc.net.0.hwaddr"),
            lxc_path,
        )


def leftovers(fp: Footprint, nft: NftInternetSet) -> list[str]:
    left = []
    cdir = fp.lxc_path / fp.id
    if cdir.exists():
        left.append(f"container dir {cdir} ({sorted(p.name for p in cdir.iterdir())})")
    if (fp.lxc_path / ".runtime" / "creating" / f"{fp.id}.json").exists():
        left.append("create marker")
    if fp.id in host_run("lxc-ls", "-P", str(fp.lxc_path), "-1").stdout.split():
        left.append("lxc-ls lists it")
    for controller in ("pids", "memory", "cpu", "cpuacct", "devices") if CGROUP_V1 else ("",):
        group = cgroup_dir(fp.id, controller)
        if group.exists():
            left.append(f"cgroup {group}")
    if fp.port and host_run("ip", "link", "show", "dev", fp.port).returncode == 0:
        left.append(f"veth {fp.port}")
    # the port binding (issue 26): its chains and map elements in the bridge table
    bridge = host_run("nft", "list", "table", "bridge", nft.table).stdout
    hexid = fp.id.removeprefix("sbx-")
    for what in (f"chain in_{hexid} ", f"chain out_{hexid} ", f"jump in_{hexid}", f"jump out_{hexid}"):
        if what in bridge:
            left.append(f"bridge {what.strip()}")
    if fp.ip:
        if nft.contains(fp.ip):
            left.append(f"nft element {fp.ip}")
        used = {
            v.split("/")[0]
            for cfg in fp.lxc_path.glob("*/config")
            for v in config_values(cfg.parent.name, "lxc.net.0.ipv4.address", fp.lxc_path)
        }
        if fp.ip in used:
            left.append(f"address {fp.ip} still allocated")
        # flows that could still pass as "established" (TIME_WAIT/CLOSE ones cannot)
        flows = host_run("conntrack", "-L", "-s", fp.ip).stdout.splitlines()
        live = [f for f in flows if not re.search(r"\b(TIME_WAIT|CLOSE)\b", f)]
        if live:
            left.append(f"live conntrack entries {live[:2]}")
    if LEASES.exists() and (
        (fp.mac and fp.mac in LEASES.read_text()) or (fp.ip and f" {fp.ip} " in LEASES.read_text())
    ):
        left.append("dnsmasq lease")
    return left


def check_nothing_left(fp: Footprint, nft: NftInternetSet, control: str = "SBX-LIFE-01") -> None:
    left = leftovers(fp, nft)
    require(control, not left, f"{fp.id} left {left}")


@dataclasses.dataclass(frozen=True)
class PveFootprint:
    """What a PVE-backed sandbox puts on its node and in PVE (taken before destroy, compared after)."""

    id: str
    ip: str
    vmid: str
    site: Site

    @classmethod
    def of(cls, t: Target) -> PveFootprint:
        return cls(t.id, t.ip, t.ct, site_of(t))


def pve_leftovers(fp: PveFootprint) -> list[str]:
    site, admin = fp.site, fp.site.admin_api
    left = []
    cts = {str(r["vmid"]): r for r in admin.cluster.resources.get(type="vm")}
    if fp.vmid in cts:
        left.append(f"CT {fp.vmid} ({cts[fp.vmid].get('tags')})")
    holding = [
        str(r["vmid"]) for r in cts.values()
        if f"ip={fp.ip}/" in str(admin.nodes(r["node"]).lxc(r["vmid"]).config.get().get("net0", ""))
    ]  # fmt: skip
    if holding:
        left.append(f"address {fp.ip} still on CTs {holding}")
    for path in (site.config_file(fp.vmid).parent, site.path(f"/etc/pve/lxc/{fp.vmid}.conf")):
        if path.exists():
            left.append(f"node file {path}")
    if site.run("ip", "link", "show", "dev", f"veth{fp.vmid}i0").returncode == 0:
        left.append(f"veth veth{fp.vmid}i0 in the node")
    for controller in ("pids", "memory", "cpu", "cpuacct", "devices") if CGROUP_V1 else ("",):
        if site.cgroup_dir(fp.vmid, controller).exists():
            left.append(f"cgroup {site.cgroup_dir(fp.vmid, controller)}")
    flows = site.run("conntrack", "-L", "-s", fp.ip).stdout.splitlines()
    live = [f for f in flows if not re.search(r"\b(TIME_WAIT|CLOSE)\b", f)]
    if live:
        left.append(f"live conntrack entries in the node {live[:2]}")
    compiled = site.run("nft", "list", "table", "inet", "pve-firewall-emu").stdout
    if f"ct{fp.vmid}-" in compiled or re.search(rf"\b{re.escape(fp.ip)}\b", compiled):
        left.append("pve-firewall rules")
    if (site.settings.state_dir / "proxmox" / "creating" / f"{fp.id}.json").exists():
        left.append("create marker")
    return left


def check_nothing_left_pve(fp: PveFootprint, control: str = "SBX-LIFE-01") -> None:
    left = pve_leftovers(fp)
    require(control, not left, f"{fp.id} (CT {fp.vmid}) left {left}")


def check_egress_addresses_only(t: Target, bystander: Target, net: SimNet, nft: Any) -> None:
    """SBX-NET-16 with an address list (PVE: the CT firewall's rules): ``t`` (internet off,
    egress=[the wan's address]) reaches that address on the allowed ports and nothing else, asks no
    resolver but the host's; ``bystander`` gains nothing; set_egress([]) closes it."""
    c = "SBX-NET-16"
    require(c, not nft.contains(t.ip), "an egress list turned internet on")
    r = probe(t, "http", net.wan_ip, 80)
    require(c, r["ok"] and r["body"] == net.http_body(net.wan_ip, 80), f"the listed address: {r}")
    beyond = sweep(t, [f"{net.other_web_ip}:80", f"{net.public_web_ip}:80,443", f"{net.wan_ip}:8080,22"])
    require(c, not beyond, f"reached what the list does not allow: {sorted(beyond)}")
    check_no_lan(t, net)
    direct = probe(t, "dns-many", net.dns_name, f"{net.wan_ip}/udp", f"{net.public_resolver_ip}/udp")
    require(c, set(direct.values()) == {None}, f"other resolvers answered the listed sandbox: {direct}")
    gained = sweep(bystander, [f"{net.wan_ip}:80,443"])
    require(c, not gained, f"a sandbox without a list reached the other's: {sorted(gained)}")
    require(c, t.sb.set_egress([]) == (), "set_egress([]) kept entries")
    closed = sweep(t, [f"{net.wan_ip}:80"])
    require(c, not closed, f"still reachable after set_egress([]): {sorted(closed)}")


def check_pve_network_state_forgotten(t: Target) -> None:
    """SBX-LIFE-05 on PVE: a sandbox's network state is its CT's firewall (options, internet and
    egress rules) and what pve-firewall compiled of it; destroy leaves neither."""
    from proxmoxer.core import ResourceException

    c = "SBX-LIFE-05"
    site = site_of(t)
    admin = site.admin_api
    node = next(str(r["node"]) for r in admin.cluster.resources.get(type="vm") if str(r["vmid"]) == t.ct)
    fw = admin.nodes(node).lxc(t.ct).firewall
    comments = {str(r.get("comment")) for r in fw.rules.get()}
    assert {"sandbox-rt internet", "sandbox-rt egress"} <= comments, f"precondition: its rules ({comments})"

    def compiled() -> str:
        return site.run("nft", "list", "table", "inet", "pve-firewall-emu").stdout

    assert f"ct{t.ct}-out" in compiled(), "precondition: pve-firewall compiled its rules"
    t.sb.destroy()
    # PVE reads a guest's firewall from /etc/pve/firewall/<vmid>.fw: for a gone CT it answers what
    # an absent file holds (no options, no rules) or an error, never the old settings
    for what, call in (("options", fw.options.get), ("rules", fw.rules.get)):
        try:
            left = call()
        except ResourceException:
            continue
        if isinstance(left, dict):
            left = {k: v for k, v in left.items() if k != "digest"}
        require(c, not left, f"CT {t.ct}'s firewall {what} outlived it: {left}")
    text = compiled()
    require(c, f"ct{t.ct}-" not in text and t.ip not in text, f"pve-firewall still has rules of CT {t.ct}")
    for name in (t.settings.nft_internet_set, "egress_sources"):
        kind = "set" if name == t.settings.nft_internet_set else "map"
        listed = site.run("nft", "list", kind, "inet", t.settings.nft_table, name).stdout
        require(c, t.ip not in listed, f"{t.ip} is in the node's {name}")


# -- waiver conditions ----------------------------------------------------------------------------
def apparmor_disabled() -> tuple[bool, str]:
    enabled = Path("/sys/module/apparmor/parameters/enabled")
    on = enabled.exists() and enabled.read_text().strip() == "Y"
    return (not on, f"{enabled}: {'Y' if on else 'absent or N'}")


def no_systemd(host: Host | None = None) -> tuple[bool, str]:
    """PID 1 of this machine (or of ``host``: the machine that runs the sandboxes) is not systemd."""
    if host is not None:
        comm = host.file("/proc/1/comm").content_string.strip()
        return (comm != "systemd" and not host.file("/run/systemd/system").exists, f"PID 1 is {comm}")
    comm = Path("/proc/1/comm").read_text().strip()
    return (comm != "systemd" and not Path("/run/systemd/system").exists(), f"PID 1 is {comm}")


def lxc_backend(settings: sandbox_rt.Settings) -> tuple[bool, str]:
    return (settings.backend == "lxc", f"backend {settings.backend}")


def pve_egress_names_refused(site: Site) -> tuple[bool, str]:
    """A PVE site whose runtime refuses an egress list naming a domain before anything is made (the
    CT firewall matches addresses; no per-sandbox resolver exists there)."""
    if not site.is_pve:
        return False, f"site {site.name} is not PVE"
    mgr = sandbox_rt.Manager(site.settings)
    before = {r["vmid"] for r in site.admin_api.cluster.resources.get(type="vm")}
    try:
        sb = mgr.create(egress=["example.test"], labels={"test-session": "hardening-names"}, memory_mb=256)
    except sandbox_rt.ConfigError as exc:
        after = {r["vmid"] for r in site.admin_api.cluster.resources.get(type="vm")}
        return after == before and "domain name" in str(exc), f"refused: {exc}; CTs made: {after - before}"
    sb.destroy()
    return False, "a sandbox with a name in its egress list was created"


def pve_firewall_keeps_established(site: Site) -> tuple[bool, str]:
    """A PVE site whose (emulated) pve-firewall accepts established flows before any guest's rules,
    as pve-firewall does (RELATED,ESTABLISHED -j ACCEPT): a rule switched off ends no open flow."""
    if not site.is_pve:
        return False, f"site {site.name} is not PVE"
    chain = site.host.run("nft list chain inet pve-firewall-emu forward").stdout
    lines = [ln.strip() for ln in chain.splitlines() if ln.strip().startswith(("ct state", "ip "))]
    first = lines[0] if lines else ""
    holds = first.startswith("ct state established,related accept")
    return holds, f"the node's pve-firewall forward chain starts with {first!r}"


def overlay_disk_unbounded(t: Target, disk_gb: int) -> tuple[bool, str]:
    """The clone's upper dir is a plain directory on the LXC path's filesystem, and the sandbox can
    allocate more than ``disk_gb`` there."""
    rootfs = ct_config_values(t, "lxc.rootfs.path")[-1]
    kind, _, rest = rootfs.partition(":")
    upper = Path(rest.partition(":")[2])
    site = site_of(t)
    upper = site.path(upper)
    same_fs = upper.exists() and upper.stat().st_dev == site.lxc_dir.stat().st_dev
    size = disk_gb * 1024 + 100
    r = run_user(
        t,
        f"fallocate -l {size}M /home/sandbox/.fill && du -m /home/sandbox/.fill; rm -f /home/sandbox/.fill",
        timeout=60,
    )
    used = r.text.split()[:1]
    wrote = r.exit_code == 0 and bool(used) and used[0].isdigit() and int(used[0]) >= size
    return (
        kind.startswith("overlay") and same_fs and wrote,
        f"rootfs {kind}, upper on the LXC path's fs: {same_fs}, allocated {size} MiB: {wrote}",
    )


# -- root on request (SBX-ESC-27) -------------------------------------------------------------------
# Docker's default capability set (moby oci/caps/defaults.go) less net_raw (SBX-NET-15): all that the
# root of a root=True sandbox holds. Pinned here, not read from the role: widening the set fails.
DOCKER_DEFAULT_CAPS = frozenset(
    {"chown", "dac_override", "fowner", "fsetid", "kill", "setgid", "setuid", "setpcap", "net_bind_service",
     "net_raw", "sys_chroot", "mknod", "audit_write", "setfcap"}
)  # fmt: skip
ROOT_ON_REQUEST_CAPS = DOCKER_DEFAULT_CAPS - {"net_raw"}


def as_root_login(t: Target, root_host: Host) -> Target:
    """``t`` (a root=True sandbox) with its container root reached as an agent reaches it: SSH."""
    return dataclasses.replace(t, root=root_host, root_login=True)


def check_root_on_request(t: Target) -> None:
    """SBX-ESC-27: root over the runtime's SSH in a sandbox made with root=True is uid 0 of an
    unprivileged container holding at most Docker's default capabilities less net_raw, filtered,
    with no new privileges; every escape and kernel-surface attempt fails for it as it does for the
    container root lxc-attach gives; it cannot change its address or send raw frames."""
    c = "SBX-ESC-27"
    require(c, t.root_login and t.sb.root, "the target is not a root=True sandbox reached as root over SSH")
    r = run_root(t, "id -u; grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status")
    require(c, r.returncode == 0, f"root over SSH failed: {r.stderr}")
    lines = r.stdout.split("\n")
    fields = dict(line.split(":\t", 1) for line in lines[1:] if ":\t" in line)
    require(c, lines[0] == "0", f"root's shell is uid {lines[0]}")
    want = sum(1 << CAPS[cap] for cap in ROOT_ON_REQUEST_CAPS)
    for key in ("CapEff", "CapBnd"):
        got = int(fields.get(key, "0"), 16)
        extra = sorted(name for name, bit in CAPS.items() if got & (1 << bit) and not want & (1 << bit))
        require(c, not extra, f"root holds {extra} beyond Docker's default set ({key} {got:x})")
        require(c, got == want, f"root's {key} {got:x} is not Docker's default set less net_raw {want:x}")
    require(c, fields.get("NoNewPrivs") == "1" and fields.get("Seccomp") == "2", f"root runs {fields}")
    check_unprivileged(t)  # that uid 0 is the sandbox's own unprivileged host range
    # the kernel surface, as that root: every call the filter refuses is refused, by the filter
    check_refused(t, *FAMILY_CONTROLS, as_root=True)
    # the shell-level escapes, as that root
    for check in (check_no_mounts, check_no_modules, check_no_user_namespaces, check_proc_sys_readonly):
        check(t)
    changed = _attempts(
        t,
        ["ip addr add 10.123.0.9/32 dev eth0", "ip link set eth0 address 02:00:00:00:00:09",
         "python3 -c 'import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW)'",
         "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)'"],
        as_root=True,
    )  # fmt: skip
    require(c, not changed, f"root over SSH could: {changed}")


# -- nothing runs as root without root (SBX-ESC-28) -------------------------------------------------
def sandbox_uids(t: Target) -> dict[int, tuple[int, ...]]:
    """{host pid: (real, effective, saved, fs uid as this machine numbers them)} of every process
    of ``t``, read from this machine's /proc (nothing the sandbox reports)."""
    ns = Path(f"/proc/{init_pid(t)}/ns/pid").readlink()
    out: dict[int, tuple[int, ...]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError):  # a process gone meanwhile
            if (entry / "ns" / "pid").readlink() == ns:
                uid_line = next(
                    ln for ln in (entry / "status").read_text().splitlines() if ln.startswith("Uid:")
                )
                out[int(entry.name)] = tuple(int(v) for v in uid_line.split()[1:])
    return out


def check_nothing_runs_as_root(t: Target) -> None:
    """SBX-ESC-28: in a sandbox made without root no process has uid 0 in any of its ids: PID 1
    starts as the sandbox user (lxc.init.uid/gid with the login limits as lxc.prlimit.*), sshd and
    every login, command, terminal and background process are that user, port 22 is open to it."""
    c = "SBX-ESC-28"
    assert not t.sb.root, "precondition: a sandbox made without root"
    s = t.settings
    base = idmap_base_for(t.ip, s.ip_pool_start, s.idmap_base) if s.idmap_isolated else s.idmap_base
    user = base + SANDBOX_UID
    with t.sb.pty(80, 24) as term:  # a terminal, a background process and a command at once
        bg = t.sb.exec("sleep 60", background=True)
        try:
            seen = sandbox_uids(t)
        finally:
            bg.kill()
            term.write("exit\n")
    wrong = {pid: ids for pid, ids in seen.items() if set(ids) != {user}}
    require(c, len(seen) >= 4 and not wrong, f"processes not running as the sandbox user {user}: {wrong}")
    want = {"lxc.init.uid": [str(SANDBOX_UID)], "lxc.init.gid": [str(SANDBOX_UID)]}
    for key, value in want.items():
        require(c, ct_config_values(t, key) == value, f"{key} is {ct_config_values(t, key)}")
    port = t.user.file("/proc/sys/net/ipv4/ip_unprivileged_port_start").content_string.strip()
    require(c, port == "22", f"ip_unprivileged_port_start is {port}")
    key = t.user.file("/etc/ssh/ssh_host_ed25519_key")
    require(c, key.user == "sandbox" and key.mode == 0o600, f"host key {key.user} {oct(key.mode)}")


def pve_root_side_refused(t: Target, make: Callable[..., Target]) -> tuple[bool, str]:
    """SBX-ESC-28's PVE waiver: a PVE sandbox's PID 1 is root even without root, and a fork of a root
    sandbox's snapshot is refused without root (a template built from code likewise:
    tests/integration/test_template_from_code_pve.py)."""
    pid1 = proc_status(init_pid(t))["Uid"].split()[0]
    source = make(root=True)
    name = f"esc28{secrets.token_hex(3)}"
    source.sb.snapshot(name)
    mgr = sandbox_rt.Manager(t.settings)
    try:
        fork = mgr.create(from_snapshot=name, memory_mb=256, labels=dict(t.sb.record.spec.labels))
    except sandbox_rt.ConfigError as exc:
        refused = "root=True only" in str(exc)
    else:
        fork.destroy()
        refused = False
    finally:
        with contextlib.suppress(sandbox_rt.SandboxError):
            mgr.delete_snapshot(name)
    return refused, f"PID 1 host uid {pid1}; a fork without root of a root sandbox refused: {refused}"
