"""Agent-facing doors cannot widen what the operator set (issue 35, attack 5): the one policy object
(:class:`sandbox_rt.policy.DoorPolicy`), and each door that applies it (native HTTP, the OpenSandbox
dialect, MCP, the remote clients) against fakes. The same attack through the real servers and real
sandboxes is tests/integration/test_door_policy.py."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from mcp import Client

from sandbox_rt import ConfigError, PolicyDenied, Settings, remote
from sandbox_rt.caps import DEFAULT_DISK_IOPS, DEFAULT_DISK_MBPS, DEFAULT_NET_MBPS, MAX_DISK_MBPS
from sandbox_rt.cli import _parser
from sandbox_rt.mcp.server import McpOptions, SandboxMcp
from sandbox_rt.policy import CAP_OPTIONS, DoorPolicy
from sandbox_rt.web.opensandbox import lifecycle
from sandbox_rt.web.opensandbox.mapping import plan_create
from sandbox_rt.web.server import ApiServer
from tests.unit import test_mcp_server as mcp_fakes
from tests.unit.test_http_api import AUTH, TOKEN, FakeManager
from tests.unit.test_opensandbox_lifecycle import KEY, LifecycleFake

# what the attack asked through MCP: root, and every cap off
ATTACK: dict[str, Any] = {"root": True, "disk_mbps": 0, "disk_iops": 0, "net_mbps": 0}
UNCAPPED = {"disk_mbps": 0, "disk_iops": 0, "net_mbps": 0}


# -- the policy ----------------------------------------------------------------------------------------
def test_the_default_refuses_root_and_names_the_option() -> None:
    with pytest.raises(PolicyDenied, match=r"root=true is refused.*sandbox-rt serve.*--allow-root"):
        DoorPolicy().check_create({"root": True})
    with pytest.raises(PolicyDenied, match=r"sandbox-rt mcp.*--allow-root"):
        DoorPolicy(door="sandbox-rt mcp").check_create(ATTACK)  # root is named first
    for fine in ({}, {"root": False}, {"root": None}, {"cpus": 2, "memory_mb": 512}):
        DoorPolicy().check_create(fine)
    DoorPolicy(allow_root=True).check_create({"root": True})
    assert issubclass(PolicyDenied, ConfigError)  # callers that catch ConfigError still do


@pytest.mark.parametrize("cap", CAP_OPTIONS)
def test_a_cap_may_be_lowered_not_switched_off_or_raised(cap: str) -> None:
    policy = DoorPolicy()
    top = policy.ceiling(cap)
    assert (
        top
        == {"net_mbps": DEFAULT_NET_MBPS, "disk_mbps": DEFAULT_DISK_MBPS, "disk_iops": DEFAULT_DISK_IOPS}[cap]
    )
    with pytest.raises(
        PolicyDenied, match=rf"{cap}=0 \(no cap\) refused.*{cap} 1 to {top}.*--allow-uncapped"
    ):
        policy.check_create({cap: 0})
    with pytest.raises(PolicyDenied, match=rf"{cap}={top + 1} \(above the host's default of {top}\)"):
        policy.check_create({cap: top + 1})
    with pytest.raises(PolicyDenied, match="--allow-uncapped"):
        policy.check_create({cap: float("inf")})
    for fine in (None, 1, top // 2, top):
        policy.check_create({cap: fine})
    # a wrong kind or a negative value is make_spec's to refuse (400), not the policy's
    for odd in (True, "0", -1, float("nan")):
        policy.check_create({cap: odd})


def test_root_and_uncapped_are_separate_switches() -> None:
    rooted = DoorPolicy(allow_root=True)
    rooted.check_create({"root": True, "disk_mbps": 10})
    with pytest.raises(PolicyDenied, match=r"net_mbps=0 .*, disk_mbps=0 .*, disk_iops=0 .*--allow-uncapped"):
        rooted.check_create(
            ATTACK
        )  # every cap it refuses, in one message  # --allow-root does not switch the caps off
    uncapped = DoorPolicy(allow_uncapped=True)
    uncapped.check_create({**UNCAPPED, "disk_mbps": MAX_DISK_MBPS})
    with pytest.raises(PolicyDenied, match="--allow-root"):
        uncapped.check_create(ATTACK)
    DoorPolicy(allow_root=True, allow_uncapped=True).check_create(ATTACK)


def test_a_host_without_a_cap_has_none_to_widen() -> None:
    policy = DoorPolicy(max_disk_mbps=0)
    assert policy.ceiling("disk_mbps") == 0
    policy.check_create({"disk_mbps": 0})
    policy.check_create({"disk_mbps": MAX_DISK_MBPS})
    with pytest.raises(PolicyDenied, match="disk_iops=0"):
        policy.check_create({"disk_mbps": 0, "disk_iops": 0})


def test_the_bounds_are_the_hosts_defaults() -> None:
    settings = dataclasses.replace(
        Settings(), default_net_mbps=50, default_disk_mbps=0, default_disk_iops=300
    )

    class Runtime:
        pass

    runtime = Runtime()
    runtime.settings = settings  # type: ignore[attr-defined]
    policy = DoorPolicy.of(runtime, door="sandbox-rt mcp", allow_root=True)
    assert (policy.max_net_mbps, policy.max_disk_mbps, policy.max_disk_iops) == (50, 0, 300)
    assert policy.allow_root and not policy.allow_uncapped and policy.door == "sandbox-rt mcp"
    with pytest.raises(PolicyDenied, match="net_mbps=51"):
        policy.check_create({"net_mbps": 51})
    assert DoorPolicy.of(object()) == DoorPolicy()  # no settings (a fake): the package's defaults


@pytest.mark.parametrize(
    "bad", [{"allow_root": 1}, {"allow_uncapped": "yes"}, {"max_net_mbps": -1}, {"max_disk_iops": 1.5}]
)
def test_a_bad_policy_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="DoorPolicy"):
        DoorPolicy(**bad)


def test_serve_and_mcp_take_the_flags() -> None:
    for cmd in ("serve", "mcp"):
        args = _parser().parse_args([cmd])
        assert (args.allow_root, args.allow_uncapped) == (False, False)
        args = _parser().parse_args([cmd, "--allow-root", "--allow-uncapped"])
        assert (args.allow_root, args.allow_uncapped) == (True, True)


# -- the native HTTP API ---------------------------------------------------------------------------------
@pytest.fixture
def mgr() -> FakeManager:
    return FakeManager()


def native(mgr: FakeManager, policy: DoorPolicy | None = None) -> Iterator[Callable[..., requests.Response]]:
    """``call(body)``: a create through an ApiServer with ``policy``; ``call(body, path=...)`` a POST
    to another route."""
    with ApiServer(mgr, token=TOKEN, port=0, policy=policy) as srv, requests.Session() as session:
        yield lambda body, path="/v1/sandboxes": session.post(
            srv.url + path, json=body, headers=AUTH, timeout=10
        )


def test_native_api_refuses_root_and_uncapped_with_403(mgr: FakeManager) -> None:
    for create in native(mgr):
        r = create(ATTACK)
        assert r.status_code == 403, r.text
        err = r.json()["error"]
        assert err["code"] == "policy_denied" and err["type"] == "PolicyDenied"
        assert "--allow-root" in err["message"]
        r = create({**UNCAPPED, "labels": {"a": "b"}})
        assert r.status_code == 403 and "--allow-uncapped" in r.json()["error"]["message"]
        r = create({"disk_mbps": MAX_DISK_MBPS})  # no cap in all but name
        assert r.status_code == 403 and "above the host's default" in r.json()["error"]["message"]
        assert mgr.created == []  # nothing was asked of the runtime
        r = create({"root": "yes"})
        assert r.status_code == 400  # a wrong kind is still the schema's 400
        assert create({"disk_mbps": 10, "net_mbps": 5}).status_code == 201  # lowered: fine
        assert mgr.created == [{"disk_mbps": 10, "net_mbps": 5, "detached": True}]


def test_native_api_allow_root_lets_root_through_not_uncapped(mgr: FakeManager) -> None:
    for call in native(mgr, DoorPolicy(allow_root=True)):
        r = call({"root": True})
        assert r.status_code == 201, r.text
        assert mgr.created[-1] == {"root": True, "detached": True}
        path = f"/v1/sandboxes/{r.json()['id']}/exec"
        assert call({"command": "id -u", "user": "root"}, path=path).status_code == 200
        assert mgr.handed[-1].calls[-1][1]["user"] == "root"
        assert call({"command": "id -u", "user": "root", "stream": True}, path=path).status_code == 200
        assert mgr.handed[-1].calls[-1] == (
            "exec_stream",
            {"command": "id -u", "timeout": None, "user": "root"},
        )
        assert call({"command": "id -u", "user": None}, path=path).status_code == 200
        assert "user" not in mgr.handed[-1].calls[-1][1]  # null: the default user
        r = call(ATTACK)
        assert r.status_code == 403 and "--allow-uncapped" in r.json()["error"]["message"]
    for create in native(mgr, DoorPolicy(allow_root=True, allow_uncapped=True)):
        assert create(ATTACK).status_code == 201
        assert mgr.created[-1] == {**ATTACK, "detached": True}


# -- the remote clients: the server's refusal as the same typed error ----------------------------------
def test_remote_clients_raise_policy_denied(mgr: FakeManager) -> None:
    with ApiServer(mgr, token=TOKEN, port=0) as srv:
        with remote.Client(srv.url, token=TOKEN) as client, pytest.raises(PolicyDenied, match="--allow-root"):
            client.create(root=True)

        async def main() -> None:
            async with remote.AsyncClient(srv.url, token=TOKEN) as client:
                with pytest.raises(PolicyDenied, match=r"disk_iops=0.*--allow-uncapped"):
                    await client.create(disk_iops=0)

        asyncio.run(main())
    assert mgr.created == []


# -- the OpenSandbox dialect -----------------------------------------------------------------------------
def test_opensandbox_create_goes_through_the_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The dialect has no root or cap fields (an unknown field is a 400); its create route still
    applies the server's policy to what it asks of the runtime, and answers a refusal in its own
    error body (so a field added later cannot bypass it)."""
    mgr = LifecycleFake()
    with ApiServer(mgr, token=TOKEN, port=0, opensandbox_port=0) as srv, requests.Session() as session:
        url = f"{srv.opensandbox_url}/v1/sandboxes"
        body = {"image": {"uri": "default"}}
        r = session.post(url, json={**body, "root": True}, headers=KEY, timeout=10)
        assert r.status_code == 400, r.text
        r = session.post(url, json={**body, "extensions": {"root": "true"}}, headers=KEY, timeout=10)
        assert r.status_code == 400, r.text

        def widened(*args: Any) -> Any:
            plan = plan_create(*args)
            return dataclasses.replace(plan, kwargs={**plan.kwargs, **ATTACK})

        monkeypatch.setattr(lifecycle, "plan_create", widened)
        r = session.post(url, json=body, headers=KEY, timeout=10)
        assert r.status_code == 403, r.text
        assert r.json()["code"] == "POLICY_DENIED" and "--allow-root" in r.json()["message"]
        assert mgr.created == []


# -- MCP -----------------------------------------------------------------------------------------------
def _mcp_call(srv: SandboxMcp, *calls: dict[str, Any]) -> list[Any]:
    async def main() -> list[Any]:
        async with mcp_fakes.session(srv) as call:
            return [await call("create_sandbox", **args) for args in calls]

    return list(asyncio.run(main()))


def test_mcp_refuses_the_attack_with_a_tool_error() -> None:
    mgr = mcp_fakes.FakeManager()
    srv = SandboxMcp(mgr, McpOptions(max_sandboxes=1))  # type: ignore[arg-type]
    try:
        attack, uncapped, fine = _mcp_call(srv, ATTACK, UNCAPPED, {"disk_mbps": 10})
        assert attack.is_error and mcp_fakes.text(attack).startswith(
            "policy_denied (PolicyDenied): root=true"
        )
        assert "sandbox-rt mcp" in mcp_fakes.text(attack) and "--allow-root" in mcp_fakes.text(attack)
        assert uncapped.is_error and "--allow-uncapped" in mcp_fakes.text(uncapped)
        assert not fine.is_error, mcp_fakes.text(fine)  # the refusals took no slot of the session's one
        assert [c.get("disk_mbps") for c in mgr.created] == [10]
    finally:
        srv.close(10)


def test_mcp_allow_root_and_the_tool_schema_say_what_is_allowed() -> None:
    async def schema(srv: SandboxMcp) -> dict[str, Any]:
        async with Client(srv.server, mode="legacy") as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            props: dict[str, Any] = tools["create_sandbox"].input_schema["properties"]
            return props

    mgr = mcp_fakes.FakeManager()
    plain = SandboxMcp(mgr)  # type: ignore[arg-type]
    rooted = SandboxMcp(mgr, policy=DoorPolicy(allow_root=True, door="sandbox-rt mcp"))  # type: ignore[arg-type]
    try:
        props = asyncio.run(schema(plain))
        assert "this server refuses it" in props["root"]["description"]
        assert f"1 to {DEFAULT_DISK_MBPS}" in props["disk_mbps"]["description"]
        assert "refuses" not in asyncio.run(schema(rooted))["root"]["description"]
        made, attack = _mcp_call(rooted, {"root": True}, ATTACK)
        assert not made.is_error and mgr.created[-1]["root"] is True
        assert attack.is_error and "--allow-uncapped" in mcp_fakes.text(attack)
    finally:
        plain.close(10)
        rooted.close(10)
