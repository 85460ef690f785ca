"""The file routes of the native HTTP API against odd names on a real LXC sandbox (issue 35, found by
fuzzing: ``files/rename`` answered 500). OpenSSH's sftp-server says only FAILURE for a rename across
two mounts, a mount point moved, a change on a read-only mount or a creat of ``name/``; a name that
is not UTF-8 reached the server as bytes. Each answer is the API's 4xx error body with the cause
named, never a 500. The sandbox mounts a named volume, an empty one and a read-only host directory;
everything is removed afterwards, whatever failed."""

from __future__ import annotations

import errno
import json
import secrets
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from sandbox_rt.web.server import ApiServer
from tests.integration.prepared import labelled_manager

pytestmark = pytest.mark.slow

TOKEN = secrets.token_urlsafe(32)
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LABELS = {"test-http-file-names": uuid.uuid4().hex[:12]}
RUN = uuid.uuid4().hex[:8]
VOLUMES = (f"names-{RUN}-a", f"names-{RUN}-b")
SCRATCH = "/tmp/names"
ODD = [
    f"{SCRATCH}/\n",
    f"{SCRATCH}/a\nb",
    f"{SCRATCH}/\x01",
    f"{SCRATCH}/ ",
    f"{SCRATCH}/é",
    f"{SCRATCH}/" + "x" * 255,
    f"{SCRATCH}/" + "x" * 256,
    f"{SCRATCH}/" + ("u" * 250 + "/") * 15,
    "/" + "z" * 5000,
    f"{SCRATCH}/..",
    f"{SCRATCH}/.",
    f"{SCRATCH}/",
    f"{SCRATCH}/f/",
    f"{SCRATCH}/f/x",
    f"{SCRATCH}/d/",
    "/",
    "/..",
    "/proc/1",
    "/proc/self/x",
    "/dev/null",
    "/sys/x",
    "/data/x",
    "/data2",
    "/ro",
    "/ro/seed",
    "/ro/x",
    "/etc/passwd",
    f"{SCRATCH}/odd",
    f"{SCRATCH}/badlink",
]


@dataclass
class Box:
    url: str
    sid: str
    session: requests.Session

    def call(self, method: str, route: str, **kwargs: Any) -> requests.Response:
        if "json" in kwargs:  # a name may hold anything JSON can carry
            kwargs["data"] = json.dumps(kwargs.pop("json")).encode()
        headers = {**AUTH, "Content-Type": "application/json"}
        return self.session.request(
            method, f"{self.url}/v1/sandboxes/{self.sid}{route}", headers=headers, timeout=120, **kwargs
        )

    def reset(self) -> None:
        command = (
            f"rm -rf {SCRATCH} /data/*; mkdir -p {SCRATCH}/d && echo f > {SCRATCH}/f && echo x > /data/x"
            f" && touch {SCRATCH}/$'odd\\xff' && ln -sfn $'/tmp/\\xfe' {SCRATCH}/badlink"
        )
        r = self.call("POST", "/exec", json={"command": command})
        assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text


@pytest.fixture(scope="module")
def box() -> Iterator[Box]:
    scratch = Path(tempfile.mkdtemp(prefix="sandbox-rt-file-names-"))
    (scratch / "allowed").mkdir()
    (scratch / "allowed" / "seed").write_text("seeded\n")
    settings = {"volume_dir": scratch / "volumes", "volume_host_dirs": [str(scratch / "allowed")]}
    try:
        with labelled_manager(LABELS, **settings) as manager:
            for name in VOLUMES:
                manager.volumes.create(name)
            mounts = {
                "/data": {"volume": VOLUMES[0]},
                "/data2": {"volume": VOLUMES[1]},
                "/ro": {"host_path": str(scratch / "allowed"), "read_only": True},
            }
            with ApiServer(manager, token=TOKEN, host="127.0.0.1", port=0) as server:
                body = {"labels": LABELS, "memory_mb": 256, "volumes": mounts}
                r = requests.post(f"{server.url}/v1/sandboxes", headers=AUTH, json=body, timeout=240)
                assert r.status_code == 201, r.text
                b = Box(server.url, r.json()["id"], requests.Session())  # one connection, kept alive
                try:
                    b.reset()
                    yield b
                finally:
                    b.session.close()
                    manager.destroy(b.sid)
                    for name in VOLUMES:
                        manager.volumes.remove(name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _error(r: requests.Response) -> dict[str, Any]:
    assert r.headers["content-type"].startswith("application/json"), r.headers
    error = r.json()["error"]
    assert isinstance(error["code"], str) and isinstance(error["message"], str)
    return dict(error)


@pytest.mark.parametrize(
    ("method", "route", "kwargs", "status", "errno_name"),
    [
        ("POST", "/files/rename", {"json": {"src": "/data/x", "dst": f"{SCRATCH}/x"}}, 409, "EXDEV"),
        ("POST", "/files/rename", {"json": {"src": f"{SCRATCH}/f", "dst": "/data2/f"}}, 409, "EXDEV"),
        ("POST", "/files/rename", {"json": {"src": f"{SCRATCH}/f", "dst": "/proc/self/x"}}, 409, "EXDEV"),
        ("POST", "/files/rename", {"json": {"src": "/ro/seed", "dst": "/ro/s2"}}, 403, "EROFS"),
        ("POST", "/files/rename", {"json": {"src": f"{SCRATCH}/d", "dst": "/.."}}, 409, None),
        ("PUT", "/files", {"params": {"path": "/ro/x"}, "data": b"1"}, 403, "EROFS"),
        ("PUT", "/files", {"params": {"path": "/sys/x"}, "data": b"1"}, 403, "EROFS"),
        ("PUT", "/files", {"params": {"path": f"{SCRATCH}/f/"}, "data": b"1"}, 409, "EISDIR"),
        ("POST", "/files/mkdir", {"json": {"path": "/ro/d"}}, 403, "EROFS"),
        ("DELETE", "/files", {"params": {"path": "/ro/seed"}}, 403, "EROFS"),
        ("GET", "/files", {"params": {"path": "/" + "z" * 5000}}, 400, "ENAMETOOLONG"),
        ("GET", "/files/list", {"params": {"path": SCRATCH}}, 409, "EILSEQ"),
    ],
)
def test_what_sftp_does_not_explain_is_named(
    box: Box, method: str, route: str, kwargs: dict[str, Any], status: int, errno_name: str | None
) -> None:
    box.reset()
    r = box.call(method, route, **kwargs)
    assert r.status_code == status, r.text
    error = _error(r)
    assert error["type"] == "FileOperationError", error
    if errno_name is not None:
        assert error["message"].startswith(f"[Errno {getattr(errno, errno_name)}]"), error


def test_a_link_whose_target_is_not_utf8_is_shown_without_it(box: Box) -> None:
    box.reset()
    r = box.call("GET", "/files/stat", params={"path": f"{SCRATCH}/badlink", "follow_symlinks": "false"})
    assert r.status_code == 200, r.text
    assert r.json()["type"] == "symlink" and r.json()["symlink_target"] is None


def test_no_odd_name_gets_a_server_error(box: Box) -> None:
    """Every file route with every odd name (and each pair of them for a rename): a 2xx, or a 4xx
    with the API's error body."""
    box.reset()
    answers: list[tuple[str, Any, requests.Response]] = []

    def note(what: str, args: Any, r: requests.Response) -> None:
        answers.append((what, args, r))
        if r.status_code == 200 and what == "rename":  # put the scene back for the next case
            box.reset()

    for name in ODD:
        note(
            "rename",
            (f"{SCRATCH}/f", name),
            box.call("POST", "/files/rename", json={"src": f"{SCRATCH}/f", "dst": name}),
        )
        note(
            "rename",
            (name, f"{SCRATCH}/moved"),
            box.call("POST", "/files/rename", json={"src": name, "dst": f"{SCRATCH}/moved"}),
        )
        note("mkdir", name, box.call("POST", "/files/mkdir", json={"path": name, "parents": False}))
        note("write", name, box.call("PUT", "/files", params={"path": name}, data=b"1"))
        note("read", name, box.call("GET", "/files", params={"path": name}))
        note("stat", name, box.call("GET", "/files/stat", params={"path": name, "follow_symlinks": "false"}))
        note("list", name, box.call("GET", "/files/list", params={"path": name, "depth": 2}))
        note("remove", name, box.call("DELETE", "/files", params={"path": name}))
        box.reset()
    bad = [(what, args, r.status_code, r.text[:200]) for what, args, r in answers if r.status_code >= 500]
    assert not bad, bad
    for _, _, r in answers:
        if r.status_code >= 400:
            _error(r)
    assert len(answers) == 8 * len(ODD)
