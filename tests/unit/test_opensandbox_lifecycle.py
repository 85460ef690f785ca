"""The OpenSandbox lifecycle API (issue 25 item 2) against an in-memory runtime: raw HTTP for the
field mapping, the errors and the API key, and the published ``opensandbox`` SDK itself (sync and
async) for create -> get -> list -> renew -> metadata -> pause/resume -> snapshots -> delete."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import datetime as dt
import os
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import requests
from opensandbox import Sandbox, SandboxManager
from opensandbox.config import ConnectionConfig
from opensandbox.config.connection_sync import ConnectionConfigSync
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.sandboxes import NetworkPolicy, NetworkRule, SandboxFilter
from opensandbox.sync.manager import SandboxManagerSync
from opensandbox.sync.sandbox import SandboxSync

from sandbox_rt import ConfigError, SandboxNotFound, SandboxRecord, SandboxSpec, SnapshotInfo, StateConflict
from sandbox_rt.validation import MAX_TTL_S, check_sandbox_id, check_snapshot_name, make_spec
from sandbox_rt.web.opensandbox import state
from sandbox_rt.web.opensandbox.lifecycle import LifecycleRuntime
from sandbox_rt.web.opensandbox.lifecycle_models import NetworkPolicyBody
from sandbox_rt.web.opensandbox.mapping import parse_cpu, parse_quantity, policy_egress, resource_kwargs
from sandbox_rt.web.server import ApiServer
from tests.unit.test_http_api import TOKEN, FakeManager, FakeSandbox

KEY = {"OPEN-SANDBOX-API-KEY": TOKEN}
HOST_DEFAULT_TTL_S = 3600


# -- the fake runtime ----------------------------------------------------------------------------------
class LifecycleFake(FakeManager):
    """test_http_api's FakeManager with what the lifecycle API adds: records, states, pause, record
    changes by id, snapshots."""

    def __init__(self) -> None:
        super().__init__()
        self.states: dict[str, str] = {}
        self.expiry: dict[str, float | None] = {}
        self.born: dict[str, float] = {}
        self.snaps: dict[str, SnapshotInfo] = {}

    def create(self, **kwargs: Any) -> FakeSandbox:
        if kwargs.get("from_snapshot") is not None and kwargs["from_snapshot"] not in self.snaps:
            from sandbox_rt import SnapshotNotFound

            raise SnapshotNotFound(kwargs["from_snapshot"])
        sb = super().create(**kwargs)
        self.states[sb.id] = "running"
        self.expiry[sb.id] = time.time() + (kwargs.get("ttl_s") or HOST_DEFAULT_TTL_S)
        self.born[sb.id] = time.time()
        return sb

    def get(self, sandbox_id: str) -> SandboxRecord:
        check_sandbox_id(sandbox_id)
        box = self.boxes.get(sandbox_id)
        if box is None:
            raise SandboxNotFound(sandbox_id)
        spec = SandboxSpec(
            cpus=float(box.kwargs.get("cpus", 1)),
            memory_mb=int(box.kwargs.get("memory_mb", 1024)),
            labels=dict(box.kwargs.get("labels") or {}),
            template=box.kwargs.get("template") or "default",
        )
        return SandboxRecord(
            box.id,
            box.id,
            "10.99.1.7",
            "ssh-ed25519 AAAA",
            spec,
            self.born[box.id],
            self.expiry[box.id],
            1,
            "h",
            "fake",
        )

    def list(self, labels: Mapping[str, str] | None = None) -> builtins.list[SandboxRecord]:
        want = dict(labels or {})
        return [
            r for r in map(self.get, self.boxes) if all(r.spec.labels.get(k) == v for k, v in want.items())
        ]

    def state(self, sandbox_id: str) -> str:
        self.get(sandbox_id)
        return self.states[sandbox_id]

    def pause(self, sandbox_id: str) -> None:
        if self.state(sandbox_id) == "stopped":
            raise StateConflict(f"sandbox {sandbox_id} is stopped: only a running sandbox can pause")
        self.states[sandbox_id] = "frozen"

    def resume(self, sandbox_id: str) -> None:
        self.state(sandbox_id)
        self.states[sandbox_id] = "running"

    def extend(self, sandbox_id: str, ttl_s: int) -> SandboxRecord:
        self.get(sandbox_id)
        make_spec(ttl_s=ttl_s)
        self.expiry[sandbox_id] = time.time() + ttl_s
        return self.get(sandbox_id)

    def relabel(self, sandbox_id: str, labels: Mapping[str, str]) -> SandboxRecord:
        self.get(sandbox_id)
        self.boxes[sandbox_id].kwargs["labels"] = dict(make_spec(labels=labels).labels)
        return self.get(sandbox_id)

    def destroy(self, sandbox_id: str) -> None:
        super().destroy(sandbox_id)
        self.states.pop(sandbox_id, None)

    def snapshot(self, sandbox_id: str, name: str) -> SnapshotInfo:
        self.get(sandbox_id)
        check_snapshot_name(name)
        if name in self.snaps:
            raise StateConflict(f"a snapshot named {name!r} exists")
        self.snaps[name] = SnapshotInfo(name, sandbox_id, time.time(), "fake")
        return self.snaps[name]

    def list_snapshots(self) -> builtins.list[SnapshotInfo]:
        return list(self.snaps.values())

    def delete_snapshot(self, name: str) -> None:
        from sandbox_rt import SnapshotNotFound

        check_snapshot_name(name)
        if self.snaps.pop(name, None) is None:
            raise SnapshotNotFound(name)


# -- fixtures ----------------------------------------------------------------------------------------
@pytest.fixture
def mgr() -> LifecycleFake:
    return LifecycleFake()


@pytest.fixture
def server(mgr: LifecycleFake) -> Iterator[ApiServer]:
    with ApiServer(mgr, token=TOKEN, port=0, opensandbox_port=0) as srv:
        yield srv


@pytest.fixture
def base(server: ApiServer) -> str:
    assert server.opensandbox_url is not None
    return server.opensandbox_url


@pytest.fixture
def api(base: str) -> Iterator[Callable[..., requests.Response]]:
    session = requests.Session()

    def call(method: str, path: str, *, auth: bool = True, **kwargs: Any) -> requests.Response:
        headers = {**(KEY if auth else {}), **kwargs.pop("headers", {})}
        return session.request(method, base + path, headers=headers, timeout=10, **kwargs)

    yield call
    session.close()


BODY: dict[str, Any] = {
    "image": {"uri": "default"},
    "entrypoint": ["python3", "-m", "http.server"],
    "env": {"GREETING": "hi"},
    "metadata": {"project": "apollo", "team": "ml"},
    "timeout": 600,
    "resourceLimits": {"cpu": "500m", "memory": "512Mi"},
    "networkPolicy": {
        "defaultAction": "deny",
        "egress": [{"action": "allow", "target": "pypi.org"}, {"action": "allow", "target": "*.pypi.org"}],
    },
    "secureAccess": False,
}


def create(api: Callable[..., requests.Response], **changes: Any) -> dict[str, Any]:
    r = api("POST", "/v1/sandboxes", json={**BODY, **changes})
    assert r.status_code == 202, r.text
    out: dict[str, Any] = r.json()
    return out


def error_of(r: requests.Response, status: int, code: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"code", "message"} and body["code"] == code, body
    message: str = body["message"]
    return message


# -- create ------------------------------------------------------------------------------------------
def test_create_maps_every_field(api: Callable[..., requests.Response], mgr: LifecycleFake) -> None:
    r = api("POST", "/v1/sandboxes", json=BODY)
    assert r.status_code == 202, r.text
    made = r.json()
    sid = made["id"]
    assert r.headers["Location"] == f"/v1/sandboxes/{sid}"
    assert made["status"]["state"] == "Running" and made["metadata"] == BODY["metadata"]
    assert made["entrypoint"] == BODY["entrypoint"] and "image" not in made  # the create answer has none
    ttl = dt.datetime.fromisoformat(made["expiresAt"]).timestamp() - time.time()
    assert 590 < ttl <= 600 and made["createdAt"].endswith("Z")
    assert mgr.created == [
        {
            "detached": True,
            "template": "default",
            "ttl_s": 600,
            "cpus": 0.5,
            "memory_mb": 512,
            "labels": {"project": "apollo", "team": "ml"},
            "internet": False,
            "egress": ["pypi.org"],
        }
    ]
    # the entrypoint runs in the background with the sandbox's environment, which execd reads too
    (proc,) = mgr.boxes[sid].processes.values()
    assert proc.command == "python3 -m http.server" and dict(proc.env or {}) == {"GREETING": "hi"}
    assert f"background process {proc.pid}" in made["status"]["message"]
    assert state.default_env(sid) == {"GREETING": "hi"}
    # the full view names the template as the image
    got = api("GET", f"/v1/sandboxes/{sid}").json()
    assert got["image"] == {"uri": "default"} and got["entrypoint"] == BODY["entrypoint"]


def test_minimal_create_takes_the_hosts_defaults_and_starts_no_keepalive(
    api: Callable[..., requests.Response], mgr: LifecycleFake
) -> None:
    made = create(api, entrypoint=None, env=None, metadata=None, resourceLimits=None, networkPolicy=None)
    del made
    r = api("POST", "/v1/sandboxes", json={"image": {"uri": "base"}, "timeout": None})
    assert r.status_code == 202, r.text
    assert mgr.created[-1] == {"detached": True, "template": "base", "internet": False}
    sid = r.json()["id"]
    # no timeout: the host's default TTL (the answer says when)
    assert "expiresAt" in r.json() and r.json()["entrypoint"] == ["tail", "-f", "/dev/null"]
    assert not mgr.boxes[sid].processes  # Docker's keep-alive is not needed here: not started
    assert state.default_env(sid) == {}


@pytest.mark.parametrize(
    ("policy", "internet", "egress"),
    [
        (None, False, None),
        ({}, False, None),
        ({"defaultAction": "allow"}, True, None),
        ({"defaultAction": "deny"}, False, None),
        (
            {
                "egress": [
                    {"action": "allow", "target": "Example.com"},
                    {"action": "allow", "target": "*.example.com"},
                    {"action": "allow", "target": "10.0.0.0/8"},
                ]
            },
            False,
            ["10.0.0.0/8", "example.com"],
        ),
        (
            {
                "defaultAction": "deny",
                "egress": [
                    {"action": "deny", "target": "evil.org"},
                    {"action": "allow", "target": "*.good.org"},
                    {"action": "allow", "target": "good.org"},
                ],
            },
            False,
            ["good.org"],
        ),
    ],
)
def test_network_policy_becomes_internet_and_egress(
    api: Callable[..., requests.Response],
    mgr: LifecycleFake,
    policy: dict[str, Any] | None,
    internet: bool,
    egress: list[str] | None,
) -> None:
    create(api, networkPolicy=policy)
    assert mgr.created[-1]["internet"] is internet
    assert mgr.created[-1].get("egress") == egress


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"image": {"uri": "python:3.11"}}, "not a template of this host"),
        ({"image": {"uri": "default", "auth": {"username": "u", "password": "p"}}}, "no registries"),
        ({"snapshotId": "snap1"}, "exactly one of"),
        ({"image": None}, "exactly one of"),
        ({"timeout": 10}, "between 60 and"),
        ({"timeout": "600"}, "field 'timeout' must be a whole number"),
        ({"resourceLimits": {"cpu": "half"}}, "resourceLimits.cpu 'half'"),
        ({"resourceLimits": {"cpu": "0m"}}, "more than 0"),
        ({"resourceLimits": {"cpu": "512"}}, "cores"),
        ({"resourceLimits": {"memory": "1.5Xi"}}, "resourceLimits.memory '1.5Xi'"),
        ({"resourceLimits": {"memory": "1e9"}}, "resourceLimits.memory"),
        ({"resourceLimits": {"nvidia.com/gpu": "1"}}, "not supported (supported: cpu, memory"),
        ({"resourceLimits": {"gpu": "1"}}, "no GPUs"),
        ({"resourceRequests": {"cpu": "lots"}}, "resourceRequests.cpu"),
        (
            {"networkPolicy": {"defaultAction": "allow", "egress": [{"action": "deny", "target": "a.org"}]}},
            "cannot be enforced",
        ),
        (
            {
                "networkPolicy": {
                    "egress": [
                        {"action": "deny", "target": "x.a.org"},
                        {"action": "allow", "target": "a.org"},
                        {"action": "allow", "target": "*.a.org"},
                    ]
                }
            },
            "cuts an exception out",
        ),
        (
            {"networkPolicy": {"egress": [{"action": "allow", "target": "2001:db8::1"}]}},
            "networkPolicy: ",
        ),
        (
            {"networkPolicy": {"egress": [{"action": "allow", "target": "pypi.org"}]}},
            "allow 'pypi.org' alone cannot be enforced",
        ),
        ({"networkPolicy": {"defaultAction": "block"}}, 'must be "allow" or "deny"'),
        (
            {"volumes": [{"name": "v", "mountPath": "/d", "ossfs": {"bucket": "b"}}]},
            "object storage mounts are not supported",
        ),
        (
            {
                "volumes": [
                    {"name": "v", "mountPath": "/d", "pvc": {"claimName": "v"}, "host": {"path": "/x"}}
                ]
            },
            "exactly one of 'host' and 'pvc'",
        ),
        (
            {
                "volumes": [
                    {
                        "name": "v",
                        "mountPath": "/d",
                        "pvc": {"claimName": "v", "deleteOnSandboxTermination": True},
                    }
                ]
            },
            "volumes here outlive sandboxes",
        ),
        ({"volumes": [{"name": "v", "mountPath": "/etc", "pvc": {"claimName": "v"}}]}, "system directory"),
        ({"volumes": [{"name": "v", "mountPath": "/d", "pvc": {"claimName": "Bad_Name"}}]}, "claimName"),
        (
            {"volumes": [{"name": "v", "mountPath": "/d", "pvc": {"claimName": "v"}, "subPath": "../up"}]},
            "'..' is not allowed",
        ),
        (
            {
                "volumes": [
                    {"name": "v", "mountPath": "/a", "pvc": {"claimName": "v"}},
                    {"name": "v", "mountPath": "/b", "pvc": {"claimName": "w"}},
                ]
            },
            "not unique",
        ),
        ({"extensions": {"poolRef": "p"}}, "no extensions"),
        ({"secureAccess": True}, "secureAccess"),
        ({"platform": {"os": "windows", "arch": "amd64"}}, "cannot be satisfied"),
        ({"metadata": {"opensandbox.io/owner": "x"}}, "reserved"),
        ({"metadata": {"bad key": "x"}}, "metadata: label key 'bad key'"),
        ({"env": {"1X": "y"}}, "field 'env'"),
        ({"env": {f"V{i}": "x" * 300 for i in range(1000)}}, "larger than 1024 variables or 256 KiB"),
        ({"entrypoint": []}, "at least one word"),
        ({"entrypoint": "python app.py"}, "field 'entrypoint' must be an array of strings"),
        ({"templateId": "t1"}, "templateId"),
        ({"nope": 1}, "unknown field(s) in the create body: nope"),
    ],
)
def test_create_refuses_what_it_cannot_honour(
    api: Callable[..., requests.Response], mgr: LifecycleFake, change: dict[str, Any], needle: str
) -> None:
    message = error_of(api("POST", "/v1/sandboxes", json={**BODY, **change}), 400, "INVALID_REQUEST")
    assert needle in message, message
    assert not mgr.created and not mgr.boxes  # checked before anything is made


def test_an_unknown_template_lists_the_known_ones(api: Callable[..., requests.Response]) -> None:
    message = error_of(
        api("POST", "/v1/sandboxes", json={**BODY, "image": {"uri": "ubuntu:22.04"}}), 400, "INVALID_REQUEST"
    )
    assert "known: default, base" in message


def test_create_is_all_or_nothing_when_the_entrypoint_fails(
    api: Callable[..., requests.Response], mgr: LifecycleFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.unit.test_http_api import FakeCommands

    def boom(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise ConfigError("could not start it")

    monkeypatch.setattr(FakeCommands, "run", boom)
    error_of(api("POST", "/v1/sandboxes", json=BODY), 400, "INVALID_REQUEST")
    assert len(mgr.created) == 1 and not mgr.boxes and mgr.destroyed  # made, then destroyed
    assert mgr.handed[0].closed


def test_create_from_a_snapshot(api: Callable[..., requests.Response], mgr: LifecycleFake) -> None:
    src = create(api)["id"]
    assert api("POST", f"/v1/sandboxes/{src}/snapshots", json={"name": "base1"}).status_code == 202
    r = api("POST", "/v1/sandboxes", json={"snapshotId": "base1", "timeout": 120})
    assert r.status_code == 202, r.text
    assert mgr.created[-1]["from_snapshot"] == "base1" and "template" not in mgr.created[-1]
    got = api("GET", f"/v1/sandboxes/{r.json()['id']}").json()
    assert got["snapshotId"] == "base1" and "image" not in got
    error_of(api("POST", "/v1/sandboxes", json={"snapshotId": "nosuch"}), 404, "NOT_FOUND")


# -- get, list, delete -------------------------------------------------------------------------------
def test_list_filters_and_pages(api: Callable[..., requests.Response], mgr: LifecycleFake) -> None:
    ids = [create(api, metadata={"project": "apollo", "n": str(i)})["id"] for i in range(5)]
    other = create(api, metadata={"project": "gemini", "note": "a&b=c d"})["id"]
    native = mgr.create(labels={"sandbox-rt.pool": "p1"}).id  # an idle warm-pool sandbox: not listed
    mgr.states[ids[1]] = "frozen"

    def listed(**params: Any) -> dict[str, Any]:
        r = api("GET", "/v1/sandboxes", params=params)
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out

    everything = listed()
    assert [s["id"] for s in everything["items"]] == [*ids, other] and native not in str(everything)
    assert everything["pagination"] == {
        "page": 1,
        "pageSize": 20,
        "totalItems": 6,
        "totalPages": 1,
        "hasNextPage": False,
    }
    page2 = listed(metadata="project=apollo", page=2, pageSize=2)
    assert [s["id"] for s in page2["items"]] == ids[2:4] and page2["pagination"]["hasNextPage"] is True
    assert page2["pagination"]["totalPages"] == 3
    assert [s["id"] for s in listed(metadata="note=a%26b%3Dc%20d")["items"]] == [other]
    assert [s["id"] for s in listed(state="Paused")["items"]] == [ids[1]]
    assert listed(state="Paused")["items"][0]["status"]["state"] == "Paused"
    assert len(listed(state=["running", "Paused"])["items"]) == 6
    assert listed(page=9)["items"] == []
    for params, needle in (
        ({"state": "Sleeping"}, "'Sleeping' is not one of Pending, Running"),
        ({"metadata": "novalue"}, "query parameter 'metadata'"),
        ({"metadata": "a=1&a=2"}, "names 'a' twice"),
        ({"page": 0}, "query parameter 'page'"),
        ({"pageSize": 100000}, "query parameter 'pageSize'"),
        ({"page_size": 5}, "unknown query parameter 'page_size'"),
    ):
        assert needle in error_of(api("GET", "/v1/sandboxes", params=params), 400, "INVALID_REQUEST")


def test_get_and_delete(api: Callable[..., requests.Response], mgr: LifecycleFake) -> None:
    sid = create(api)["id"]
    got = api("GET", f"/v1/sandboxes/{sid}")
    assert got.status_code == 200 and got.json()["status"] == {
        "state": "Running",
        "message": f"entrypoint runs as background process {min(mgr.boxes[sid].processes)}",
    }
    mgr.states[sid] = "stopped"
    assert api("GET", f"/v1/sandboxes/{sid}").json()["status"]["state"] == "Failed"
    r = api("DELETE", f"/v1/sandboxes/{sid}")
    assert r.status_code == 204 and r.content == b"" and sid in mgr.destroyed
    assert state.notes(sid) is None
    assert sid in error_of(api("GET", f"/v1/sandboxes/{sid}"), 404, "NOT_FOUND")
    error_of(api("DELETE", f"/v1/sandboxes/{sid}"), 404, "NOT_FOUND")
    error_of(api("GET", "/v1/sandboxes/sbx-0123456789"), 404, "NOT_FOUND")
    error_of(api("GET", "/v1/sandboxes/not-an-id"), 400, "INVALID_REQUEST")


def test_a_sandbox_gone_while_listed_is_terminated(
    api: Callable[..., requests.Response], mgr: LifecycleFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    keep, gone = create(api)["id"], create(api)["id"]
    real = mgr.state

    def racing(sandbox_id: str) -> str:
        if sandbox_id == gone:
            raise SandboxNotFound(sandbox_id)
        return real(sandbox_id)

    monkeypatch.setattr(mgr, "state", racing)
    for params in ({}, {"state": ["Running", "Terminated"]}):
        items = api("GET", "/v1/sandboxes", params=params).json()["items"]
        assert {s["id"]: s["status"]["state"] for s in items} == {keep: "Running", gone: "Terminated"}
    error_of(api("GET", f"/v1/sandboxes/{gone}"), 404, "NOT_FOUND")


def test_notes_of_sandboxes_gone_another_way_are_swept(
    api: Callable[..., requests.Response], mgr: LifecycleFake
) -> None:
    sid = create(api)["id"]
    mgr.destroy(sid)  # the native API, the CLI or the reaper
    assert state.notes(sid) is not None
    api("GET", "/v1/sandboxes")
    assert state.notes(sid) is None


# -- renew, metadata, pause ----------------------------------------------------------------------------
def test_renew_expiration(api: Callable[..., requests.Response], mgr: LifecycleFake) -> None:
    sid = create(api)["id"]
    when = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)
    r = api("POST", f"/v1/sandboxes/{sid}/renew-expiration", json={"expiresAt": when.isoformat()})
    assert r.status_code == 200, r.text
    assert abs(dt.datetime.fromisoformat(r.json()["expiresAt"]) - when) < dt.timedelta(seconds=2)
    assert set(r.json()) == {"expiresAt"}
    past = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)).isoformat()
    for body, needle in (
        ({"expiresAt": past}, "not in the future"),
        ({"expiresAt": "2999-01-01T00:00:00"}, "time zone"),
        ({"expiresAt": "tomorrow"}, "not an RFC 3339 time"),
        ({"expiresAt": "2999-01-01T00:00:00Z"}, f"more than {MAX_TTL_S} s"),
        ({}, "field 'expiresAt' is required"),
    ):
        assert needle in error_of(
            api("POST", f"/v1/sandboxes/{sid}/renew-expiration", json=body), 400, "INVALID_REQUEST"
        )
    error_of(
        api("POST", "/v1/sandboxes/sbx-0123456789/renew-expiration", json={"expiresAt": when.isoformat()}),
        404,
        "NOT_FOUND",
    )


def test_metadata_merge_patch(api: Callable[..., requests.Response], mgr: LifecycleFake) -> None:
    sid = create(api)["id"]
    r = api("PATCH", f"/v1/sandboxes/{sid}/metadata", json={"team": None, "stage": "prod", "absent": None})
    assert r.status_code == 200, r.text
    assert r.json()["metadata"] == {"project": "apollo", "stage": "prod"} and r.json()["image"] == {
        "uri": "default"
    }
    assert mgr.get(sid).spec.labels == {"project": "apollo", "stage": "prod"}
    assert api("PATCH", f"/v1/sandboxes/{sid}/metadata", json={}).json()["metadata"] == {
        "project": "apollo",
        "stage": "prod",
    }
    merge = {"Content-Type": "application/merge-patch+json"}
    assert api("PATCH", f"/v1/sandboxes/{sid}/metadata", data=b'{"x": "1"}', headers=merge).status_code == 200
    for body, needle in (
        ({"opensandbox.io/x": "1"}, "reserved"),
        ({"sandbox-rt.pool": None}, "reserved"),
        ({"n": 1}, "field 'n' must be a string"),
        ({"k": "x" * 300}, "at most 256"),
    ):
        assert needle in error_of(
            api("PATCH", f"/v1/sandboxes/{sid}/metadata", json=body), 400, "INVALID_REQUEST"
        )
    assert "JSON object" in error_of(
        api("PATCH", f"/v1/sandboxes/{sid}/metadata", json=["x"]), 400, "INVALID_REQUEST"
    )


def test_pause_and_resume(
    api: Callable[..., requests.Response], mgr: LifecycleFake, server: ApiServer
) -> None:
    sid = create(api)["id"]
    cached = mgr.handed[-1]
    r = api("POST", f"/v1/sandboxes/{sid}/pause")
    assert r.status_code == 202 and r.content == b""
    assert api("GET", f"/v1/sandboxes/{sid}").json()["status"]["state"] == "Paused"
    assert cached.closed and len(server.cache) == 0  # the connection to a frozen sandbox is let go
    assert api("POST", f"/v1/sandboxes/{sid}/resume").status_code == 202
    assert api("GET", f"/v1/sandboxes/{sid}").json()["status"]["state"] == "Running"
    mgr.states[sid] = "stopped"
    assert "stopped" in error_of(api("POST", f"/v1/sandboxes/{sid}/pause"), 409, "CONFLICT")
    error_of(api("POST", "/v1/sandboxes/sbx-0123456789/pause"), 404, "NOT_FOUND")


# -- endpoints ---------------------------------------------------------------------------------------
def test_endpoints_route_to_this_server(api: Callable[..., requests.Response], base: str) -> None:
    sid = create(api)["id"]
    authority = base.removeprefix("http://")
    for proxy in ("false", "true"):
        r = api("GET", f"/v1/sandboxes/{sid}/endpoints/44772", params={"use_server_proxy": proxy})
        assert r.status_code == 200, r.text
        assert r.json() == {"endpoint": f"{authority}/sandboxes/{sid}/proxy/44772", "headers": KEY}
        assert r.headers["Cache-Control"] == "no-store"
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    r = api("GET", f"/v1/sandboxes/{sid}/endpoints/18080", auth=False, headers=bearer)
    assert r.json() == {"endpoint": f"{authority}{state.egress_base_path(sid)}", "headers": bearer}
    assert "not forwarded yet" in error_of(
        api("GET", f"/v1/sandboxes/{sid}/endpoints/8080"), 404, "NOT_FOUND"
    )
    error_of(api("GET", f"/v1/sandboxes/{sid}/endpoints/0"), 400, "INVALID_REQUEST")
    error_of(api("GET", f"/v1/sandboxes/{sid}/endpoints/http"), 400, "INVALID_REQUEST")
    error_of(
        api("GET", f"/v1/sandboxes/{sid}/endpoints/44772", params={"expires": "99"}), 400, "INVALID_REQUEST"
    )
    error_of(
        api("GET", f"/v1/sandboxes/{sid}/endpoints/44772", params={"use_server_proxy": "yes"}),
        400,
        "INVALID_REQUEST",
    )
    error_of(api("GET", "/v1/sandboxes/sbx-0123456789/endpoints/44772"), 404, "NOT_FOUND")
    bad_host = {"Host": "evil.example/../x"}
    assert "Host header" in error_of(
        api("GET", f"/v1/sandboxes/{sid}/endpoints/44772", headers=bad_host), 400, "INVALID_REQUEST"
    )


def test_the_state_contract() -> None:
    assert state.execd_base_path("sbx-0123456789") == "/sandboxes/sbx-0123456789/proxy/44772"
    assert state.egress_base_path("sbx-0123456789") == "/sandboxes/sbx-0123456789/proxy/18080"
    with pytest.raises(ConfigError):
        state.execd_base_path("../etc")
    assert state.default_env("sbx-00000000ff") == {}


def test_notes_on_disk_survive_and_refuse_garbage(tmp_path: Path) -> None:
    class Settings:
        state_dir = tmp_path

    class Runtime:
        settings = Settings()

    old = state._store, state._bound
    try:
        state.bind(Runtime())
        notes = state.SandboxNotes({"A": "1"}, ("sleep", "9"), 42, "default", None)
        state.put_notes("sbx-00000000aa", notes)
        path = tmp_path / "opensandbox" / "sbx-00000000aa.json"
        assert (
            path.stat().st_mode & 0o777 == 0o600
            and (tmp_path / "opensandbox").stat().st_mode & 0o777 == 0o700
        )
        state.bind(Runtime())  # another manager of the same host: the same notes
        assert state.notes("sbx-00000000aa") == notes and state.default_env("sbx-00000000aa") == {"A": "1"}
        for garbage in (
            b"[]",
            b"{",
            b'{"env": {"1": "x"}, "entrypoint": [], "entrypoint_pid": null, "image": null, '
            b'"snapshot_id": null}',
        ):
            path.write_bytes(garbage)
            with pytest.raises(Exception, match="unreadable"):
                state.default_env("sbx-00000000aa")
        os.utime(path, (0, 0))
        assert state.sweep_notes(["sbx-00000000bb"]) == 1 and not path.exists()
    finally:
        state._store, state._bound = old


# -- snapshots ---------------------------------------------------------------------------------------
def test_snapshots(api: Callable[..., requests.Response], mgr: LifecycleFake) -> None:
    a, b = create(api)["id"], create(api)["id"]
    r = api("POST", f"/v1/sandboxes/{a}/snapshots", json={"name": "before-import"})
    assert r.status_code == 202 and r.headers["Location"] == "/v1/snapshots/before-import"
    assert r.json()["status"] == {"state": "Ready"} and r.json()["sandboxId"] == a
    unnamed = api("POST", f"/v1/sandboxes/{b}/snapshots").json()["id"]
    assert unnamed.startswith("snap-")
    error_of(api("POST", f"/v1/sandboxes/{a}/snapshots", json={"name": "before-import"}), 409, "CONFLICT")
    error_of(api("POST", f"/v1/sandboxes/{a}/snapshots", json={"name": "has space"}), 400, "INVALID_REQUEST")
    listed = api("GET", "/v1/snapshots", params={"sandboxId": b}).json()
    assert [s["id"] for s in listed["items"]] == [unnamed] and listed["pagination"]["totalItems"] == 1
    assert api("GET", "/v1/snapshots", params={"state": "Failed"}).json()["items"] == []
    assert (
        len(api("GET", "/v1/snapshots", params={"state": "ready", "name": "before-import"}).json()["items"])
        == 1
    )
    assert api("GET", "/v1/snapshots/before-import").json()["name"] == "before-import"
    assert api("DELETE", "/v1/snapshots/before-import").status_code == 204
    error_of(api("GET", "/v1/snapshots/before-import"), 404, "NOT_FOUND")
    error_of(api("DELETE", "/v1/snapshots/before-import"), 404, "NOT_FOUND")


# -- the gate ------------------------------------------------------------------------------------------
def test_the_api_key_header_bearer_and_request_id(api: Callable[..., requests.Response]) -> None:
    assert api("GET", "/v1/sandboxes").status_code == 200
    assert (
        api("GET", "/v1/sandboxes", auth=False, headers={"Authorization": f"Bearer {TOKEN}"}).status_code
        == 200
    )
    for headers in ({}, {"OPEN-SANDBOX-API-KEY": "wrong"}, {"Authorization": "Bearer wrong"}):
        error_of(api("GET", "/v1/sandboxes", auth=False, headers=headers), 401, "UNAUTHORIZED")
    r = api("GET", "/v1/sandboxes", headers={"X-Request-ID": "req-42"})
    assert r.headers["X-Request-ID"] == "req-42"
    assert api("POST", "/v1/metrics/events", json={"eventType": "sandbox.create"}).status_code == 204


def test_a_runtime_without_the_lifecycle_methods_is_501() -> None:
    assert isinstance(LifecycleFake(), LifecycleRuntime) and not isinstance(FakeManager(), LifecycleRuntime)
    with ApiServer(FakeManager(), token=TOKEN, port=0, opensandbox_port=0) as srv:
        r = requests.get(f"{srv.opensandbox_url}/v1/sandboxes", headers=KEY, timeout=10)
    assert error_of(r, 501, "NOT_IMPLEMENTED")


# -- the mapping on its own ------------------------------------------------------------------------------
def test_quantities() -> None:
    assert parse_cpu("500m") == 0.5 and parse_cpu("1") == 1.0 and parse_cpu("1.5") == 1.5
    assert parse_quantity("512Mi", "m") == 512 << 20 and parse_quantity("1G", "m") == 10**9
    assert parse_quantity("1.5Gi", "m") == 3 << 29 and parse_quantity("1024", "m") == 1024
    assert resource_kwargs({"memory": "1G", "ephemeral-storage": "10Gi", "gpu": "0"}) == {
        "memory_mb": 953,
        "disk_gb": 10,
    }
    for bad in ("", "1 Gi", "-1Gi", "1gi", "1e3", "0x10", "1Mi ", "\uff11Mi"):
        with pytest.raises(ConfigError):
            parse_quantity(bad, "m")
    for bad in ("", "-1", "1.0m", "0.5 ", "½", "1e0"):
        with pytest.raises(ConfigError):
            parse_cpu(bad)


def test_policies_are_never_wider() -> None:
    def egress(*rules: tuple[str, str], default: str | None = None) -> tuple[bool, tuple[str, ...]]:
        policy = {"defaultAction": default, "egress": [{"action": a, "target": t} for a, t in rules]}
        return policy_egress(NetworkPolicyBody.model_validate(policy))

    domain = (("allow", "a.org"), ("allow", "*.a.org"))
    assert egress(default="allow") == (True, ())
    assert egress(*domain, ("deny", "b.org")) == (False, ("a.org",))
    assert egress(("allow", "10.0.0.0/8"), ("deny", "10.1.0.0/16")) == (False, ("10.0.0.0/8",))  # shadowed
    for rules in (
        (("allow", "a.org"),),  # the name only: the runtime's a.org is its subdomains too
        (("allow", "*.a.org"),),  # the subdomains only: the runtime's a.org is the name too
        (("deny", "x.a.org"), *domain),
        (("deny", "10.1.0.0/16"), ("allow", "10.0.0.0/8")),
        (("allow", "2001:db8::/32"),),
    ):
        with pytest.raises(ConfigError):
            egress(*rules)
    with pytest.raises(ConfigError, match="cannot be enforced"):
        egress(("deny", "b.org"), default="allow")


# -- the published SDK ---------------------------------------------------------------------------------
def _sdk_config(base: str, cls: Any) -> Any:
    return cls(
        api_key=TOKEN,
        domain=base,
        request_timeout=dt.timedelta(seconds=10),
        disable_metrics=True,
        endpoint_cache_disabled=True,
    )


def test_the_sync_sdk_drives_the_lifecycle(base: str, mgr: LifecycleFake) -> None:
    config = _sdk_config(base, ConnectionConfigSync)
    tag = secrets.token_hex(4)
    sb = SandboxSync.create(
        "default",
        timeout=dt.timedelta(minutes=5),
        env={"MODE": "sdk"},
        metadata={"suite": tag},
        resource={"cpu": "1", "memory": "256Mi"},
        network_policy=NetworkPolicy(
            defaultAction="deny",
            egress=[
                NetworkRule(action="allow", target="pypi.org"),
                NetworkRule(action="allow", target="*.pypi.org"),
            ],
        ),
        connection_config=config,
        skip_health_check=True,  # execd (the other router) answers /ping; this test is the lifecycle's
    )
    manager = SandboxManagerSync.create(connection_config=config)
    try:
        assert mgr.created[-1]["egress"] == ["pypi.org"] and mgr.created[-1]["memory_mb"] == 256
        info = sb.get_info()
        assert info.status.state == "Running" and info.metadata == {"suite": tag}
        assert (
            info.image is not None
            and info.image.image == "default"
            and info.entrypoint == ["tail", "-f", "/dev/null"]
        )
        endpoint = sb.get_endpoint(44772)
        assert endpoint.endpoint.endswith(f"/sandboxes/{sb.id}/proxy/44772") and endpoint.headers == KEY
        assert state.default_env(sb.id) == {"MODE": "sdk"}

        found = manager.list_sandbox_infos(SandboxFilter(metadata={"suite": tag}, states=["Running"]))
        assert [s.id for s in found.sandbox_infos] == [sb.id] and found.pagination.total_items == 1

        renewed = sb.renew(dt.timedelta(minutes=30))
        assert abs((renewed.expires_at - dt.datetime.now(dt.UTC)).total_seconds() - 1800) < 5
        patched = sb.patch_metadata({"suite": None, "stage": "b"})
        assert patched.metadata == {"stage": "b"}

        sb.pause()
        assert manager.get_sandbox_info(sb.id).status.state == "Paused"
        resumed = SandboxSync.resume(sb.id, connection_config=config, skip_health_check=True)
        assert resumed.get_info().status.state == "Running"

        snap = sb.create_snapshot("sdk-snap")
        assert snap.status.state == "Ready" and manager.get_snapshot("sdk-snap").sandbox_id == sb.id
        manager.delete_snapshot("sdk-snap")

        with pytest.raises(SandboxApiException) as caught:
            SandboxSync.create("python:3.11", connection_config=config, skip_health_check=True)
        assert caught.value.status_code == 400 and "known: default, base" in str(caught.value)
        sb.kill()
        with pytest.raises(SandboxApiException) as caught:
            manager.get_sandbox_info(sb.id)
        assert caught.value.status_code == 404 and caught.value.error.code == "NOT_FOUND"
    finally:
        with contextlib.suppress(Exception):  # killed above unless an assertion failed
            sb.kill()
        sb.close()
        manager.close()
    assert not mgr.boxes


def test_the_async_sdk_drives_the_lifecycle(base: str, mgr: LifecycleFake) -> None:
    async def run() -> None:
        config = _sdk_config(base, ConnectionConfig)
        sb = await Sandbox.create(
            "default",
            timeout=dt.timedelta(minutes=5),
            metadata={"flavour": "async"},
            connection_config=config,
            skip_health_check=True,
        )
        manager = await SandboxManager.create(connection_config=config)
        try:
            assert (await sb.get_info()).status.state == "Running"
            found = await manager.list_sandbox_infos(SandboxFilter(metadata={"flavour": "async"}))
            assert [s.id for s in found.sandbox_infos] == [sb.id]
            await sb.renew(dt.timedelta(minutes=20))
            assert (await sb.patch_metadata({"more": "x"})).metadata == {"flavour": "async", "more": "x"}
            await manager.pause_sandbox(sb.id)
            assert (await manager.get_sandbox_info(sb.id)).status.state == "Paused"
            await manager.resume_sandbox(sb.id)
            await sb.kill()
        finally:
            await sb.close()
            await manager.close()

    asyncio.run(run())
    assert not mgr.boxes


# -- pause in the backends -------------------------------------------------------------------------------
def test_pve_refuses_pause_with_a_clear_error(tmp_path: Path) -> None:
    from pve_fixtures import pve_server, pve_settings

    from sandbox_rt.backends.base import PauseBackend, pause_backend
    from sandbox_rt.backends.proxmox import ProxmoxBackend

    with pve_server() as srv:
        backend = ProxmoxBackend(pve_settings(srv, tmp_path))
        assert pause_backend(backend) is backend and isinstance(backend, PauseBackend)
        with pytest.raises(SandboxNotFound):
            backend.pause("sbx-0000000009")
        sid = "sbx-000000000a"
        backend.begin(sid)
        try:
            backend.clone(sid, SandboxSpec())
            for op in (backend.pause, backend.resume):
                with pytest.raises(ConfigError, match="CRIU checkpoint"):
                    op(sid)
        finally:
            backend.destroy(sid)
            backend.end(sid)
    with pytest.raises(ConfigError, match="cannot pause sandboxes"):
        pause_backend(object())
