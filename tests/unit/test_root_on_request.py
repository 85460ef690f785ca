"""Root on request (issue 17), fast: the flag is validated and stored, ``user="root"`` is refused
unless the sandbox was made with it, the root connection is opened once and only for root, the
flag reaches PID 1's environment on both backends (LXC config line, the CT's ``env``), and every
front door (HTTP API, remote client, CLI) carries it. The real thing (root over SSH in a real
sandbox, apt-get through the egress list, the escape checks as root) is in
tests/integration/runtime/test_root.py and tests/hardening/test_root_sandbox.py."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest
from pve_fixtures import TEMPLATE, pve_server, pve_settings
from test_manager_cleanup import PUB, FakeBackend

from pve_testserver.ctconfig import env_lines
from sandbox_rt import ConfigError
from sandbox_rt.backends.proxmox import ProxmoxBackend
from sandbox_rt.backends.records import ROOT_ENV, spec_from_json, spec_to_json
from sandbox_rt.cli import _parser
from sandbox_rt.models import ExecResult, SandboxRecord, SandboxSpec
from sandbox_rt.remote import wire
from sandbox_rt.remote.calls import create as create_call
from sandbox_rt.sandbox import Sandbox
from sandbox_rt.ssh import RawResult
from sandbox_rt.validation import check_user, make_spec


def test_root_is_a_flag_and_off_by_default() -> None:
    assert make_spec(host_cpus=2).root is False
    assert make_spec(host_cpus=2, root=True).root is True
    for bad in ("yes", 1, None):
        with pytest.raises(ConfigError, match="root="):
            make_spec(host_cpus=2, root=bad)  # type: ignore[arg-type]


def test_stored_specs_keep_the_flag_and_old_records_read_as_without() -> None:
    spec = make_spec(host_cpus=2, root=True, egress=["192.0.2.1"])
    assert spec_from_json(spec_to_json(spec)) == spec
    old = {k: v for k, v in spec_to_json(spec).items() if k != "root"}  # written before issue 17
    assert spec_from_json(old).root is False


@pytest.mark.parametrize(
    ("user", "root_allowed", "want"),
    [
        (None, False, "sandbox"),
        ("sandbox", False, "sandbox"),
        ("root", True, "root"),
        (None, True, "sandbox"),
    ],
)
def test_check_user_picks_the_account(user: str | None, root_allowed: bool, want: str) -> None:
    assert check_user(user, default="sandbox", root_allowed=root_allowed) == want


@pytest.mark.parametrize(
    ("user", "root_allowed", "message"),
    [
        ("root", False, "root=True"),
        ("bob", True, "'bob'"),
        (0, True, "user=0"),
        ("", True, "user=''"),
    ],
)
def test_check_user_refuses(user: object, root_allowed: bool, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_user(user, default="sandbox", root_allowed=root_allowed)


class _Executor:
    """What Sandbox needs of an SSH connection, recording what ran as whom."""

    def __init__(self, user: str, ran: list[tuple[str, str]]) -> None:
        self.user, self.ran, self.closed = user, ran, False

    def run(self, command: str, **_: Any) -> Any:
        self.ran.append((self.user, command))
        return RawResult(self.user.encode(), b"", 0)

    def is_connected(self) -> bool:
        return not self.closed

    def close(self) -> None:
        self.closed = True


def _sandbox(root: bool) -> tuple[Sandbox, list[tuple[str, str]], list[str]]:
    ran: list[tuple[str, str]] = []
    opened: list[str] = []
    spec = SandboxSpec(root=root)
    record = SandboxRecord("sbx-0000000001", "h", "127.0.0.1", PUB, spec, time.time(), None, 1, "h", "fake")

    def connect_as(user: str) -> Any:
        opened.append(user)
        return _Executor(user, ran)

    sb = Sandbox(record, FakeBackend(), _Executor("sandbox", ran), 30.0, connect_as if root else None)  # type: ignore[arg-type]
    return sb, ran, opened


def test_a_sandbox_without_root_refuses_root_before_anything_runs() -> None:
    sb, ran, opened = _sandbox(root=False)
    for call in (
        lambda: sb.exec("id -u", user="root"),
        lambda: sb.exec_stream("id -u", user="root"),
        lambda: sb.pty(user="root"),
    ):
        with pytest.raises(ConfigError, match="root=True"):
            call()
    assert ran == [] and opened == [] and sb.root is False
    assert sb.exec("true").stdout == b"sandbox"


def test_root_runs_on_its_own_connection_opened_once_and_closed_with_the_sandbox() -> None:
    sb, ran, opened = _sandbox(root=True)
    assert isinstance(sb.exec("a"), ExecResult)
    assert sb.exec("b", user="root").stdout == b"root"
    assert sb.exec("c", user="root").stdout == b"root"
    assert sb.exec("d", user="sandbox").stdout == b"sandbox"
    assert ran == [("sandbox", "a"), ("root", "b"), ("root", "c"), ("sandbox", "d")]
    assert opened == ["root"]  # one root connection, reused
    with pytest.raises(ConfigError, match="background"):
        sb.exec("sleep 1", user="root", background=True)
    root_conn = sb._root_ssh
    sb.close()
    assert root_conn is not None and root_conn.closed  # type: ignore[attr-defined]


def test_the_pve_env_option_reaches_pid_1s_environment() -> None:
    assert env_lines({"env": ROOT_ENV}) == [f"lxc.environment = {ROOT_ENV}"]
    assert env_lines({"env": "A=1\0B=two words"}) == [
        "lxc.environment = A=1",
        "lxc.environment = B=two words",
    ]
    assert env_lines({}) == []


# -- the proxmox backend sets (and on a fork clears) the CT's env ------------------------------------


@pytest.fixture
def pve_backend(tmp_path: Path) -> Any:
    with pve_server(TEMPLATE) as srv:
        yield ProxmoxBackend(pve_settings(srv, tmp_path)), srv.client()


def _ct_config(backend: ProxmoxBackend, api: Any, sandbox_id: str) -> dict[str, Any]:
    node, vmid = backend._find(sandbox_id)
    return dict(api.nodes(node).lxc(vmid).config.get())


def test_proxmox_sets_env_only_for_root(pve_backend: tuple[ProxmoxBackend, Any]) -> None:
    backend, api = pve_backend
    backend.clone("sbx-00000000a1", SandboxSpec(root=True))
    backend.clone("sbx-00000000a2", SandboxSpec())
    assert _ct_config(backend, api, "sbx-00000000a1").get("env") == ROOT_ENV
    assert "env" not in _ct_config(backend, api, "sbx-00000000a2")
    assert backend.get("sbx-00000000a1").spec.root is True
    # an update (warm pool hand-out, extend) never changes it
    rec = backend.get("sbx-00000000a1")
    assert backend.update(rec, dataclasses.replace(rec.spec, root=False)).spec.root is True


# -- the front doors --------------------------------------------------------------------------------
def test_remote_requests_carry_root_and_user_only_when_asked() -> None:
    assert "root" not in create_call().json  # type: ignore[operator]
    assert create_call(root=True).json["root"] is True  # type: ignore[index]
    body = wire.exec_body("id", timeout=None, cwd=None, env=None, stdin=None, max_output=10, stream=False)
    assert "user" not in body
    body = wire.exec_body(
        "id", timeout=None, cwd=None, env=None, stdin=None, max_output=10, stream=False, user="root"
    )
    assert body["user"] == "root"
    with pytest.raises(ConfigError):
        wire.exec_body(
            "id", timeout=None, cwd=None, env=None, stdin=None, max_output=10, stream=False, user=0
        )  # type: ignore[arg-type]


def test_cli_takes_root_and_user() -> None:
    args = _parser().parse_args(["create", "--root"])
    assert args.root is True
    args = _parser().parse_args(["exec", "--user", "root", "sbx-0000000001", "--", "id", "-u"])
    assert args.user == "root" and args.command[-2:] == ["id", "-u"]
    assert _parser().parse_args(["run", "--", "true"]).root is False


def test_shared_records_name_expire_and_keep_root() -> None:
    from sandbox_rt.backends.records import new_record, updated_record

    before = time.time()
    rec = new_record(
        "sbx-00000000b1",
        SandboxSpec(ttl_s=60, root=True),
        ip="10.99.1.2",
        host_key="k",
        backend="x",
    )
    assert rec.hostname == "sbx-00000000b1" and rec.owner_pid > 0 and rec.spec.root
    assert rec.expires_at is not None and before + 60 <= rec.expires_at <= time.time() + 60
    detached = new_record(
        "sbx-00000000b2", SandboxSpec(detached=True, hostname="h"), ip="", host_key="", backend="x"
    )
    assert (detached.owner_pid, detached.hostname, detached.expires_at) == (0, "h", None)
    new = updated_record(rec, SandboxSpec(ttl_s=None, memory_mb=512))
    assert (new.hostname, new.expires_at, new.spec.memory_mb, new.spec.root) == (
        rec.hostname,
        None,
        512,
        True,
    )
    assert new.created_at == rec.created_at and new.ip == rec.ip
