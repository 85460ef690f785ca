"""The file primitives over HTTP (issue 18 item 3): the server's routes onto ``sb.files`` and the remote
clients' ``sb.files`` (sync and async) against the real server with an in-memory fake, plus lying
answers. The same calls on real sandboxes: tests/integration/test_remote_clients.py."""

from __future__ import annotations

import asyncio
import errno
import posixpath
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from test_http_api import AUTH, TOKEN, FakeManager, FakeSandbox

from sandbox_rt import BackendError, ConfigError, FileOperationError, remote
from sandbox_rt.models import EntryInfo
from sandbox_rt.web.server import ApiServer


class FakeFiles:
    """A tree of dirs and files in memory (paths -> bytes, or None for a directory)."""

    def __init__(self) -> None:
        self.tree: dict[str, bytes | None] = {"/": None, "/home": None}
        self.calls: list[tuple[str, Any]] = []

    def _entry(self, path: str) -> EntryInfo:
        if path not in self.tree:
            raise FileOperationError(errno.ENOENT, "stat: no such file in the sandbox", path)
        data = self.tree[path]
        kind = "dir" if data is None else "file"
        name = posixpath.basename(path) or "/"
        return EntryInfo(name, path, kind, len(data or b""), 0o755 if data is None else 0o644, 1.0)

    def list(self, path: str, depth: int = 1) -> list[EntryInfo]:
        self.calls.append(("list", (path, depth)))
        if self.tree.get(path, b"") is not None:
            raise FileOperationError(errno.ENOTDIR, "list: not a directory", path)
        prefix = path.rstrip("/") + "/"
        return [
            self._entry(p)
            for p in sorted(self.tree)
            if p.startswith(prefix) and p != path and p[len(prefix) :].count("/") < depth
        ]

    def stat(self, path: str, *, follow_symlinks: bool = True) -> EntryInfo:
        self.calls.append(("stat", (path, follow_symlinks)))
        return self._entry(path)

    def remove(self, path: str, *, recursive: bool = False) -> None:
        self.calls.append(("remove", (path, recursive)))
        inside = [p for p in self.tree if p.startswith(path.rstrip("/") + "/")]
        if inside and not recursive:
            raise FileOperationError(errno.ENOTEMPTY, "remove: the directory is not empty", path)
        for p in [path, *inside]:
            self.tree.pop(p, None)

    def mkdir(self, path: str, *, parents: bool = True, mode: int = 0o755) -> bool:
        self.calls.append(("mkdir", (path, parents)))
        if path in self.tree:
            return False
        self.tree[path] = None
        return True

    def rename(self, src: str, dst: str) -> EntryInfo:
        self.calls.append(("rename", (src, dst)))
        self.tree[dst] = self.tree.pop(src)
        return self._entry(dst)


class FilesSandbox(FakeSandbox):
    @property
    def files(self) -> FakeFiles:
        return FILES[self.id]

    def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        super().write_file(path, data, mode=mode)
        FILES[self.id].tree[path] = data.encode() if isinstance(data, str) else data


FILES: dict[str, FakeFiles] = {}


class FilesManager(FakeManager):
    def create(self, **kwargs: Any) -> FilesSandbox:
        sb = super().create(**kwargs)
        FILES[sb.id] = FakeFiles()
        wrapped = FilesSandbox(self, sb.box)
        self.handed[-1] = wrapped
        return wrapped

    def attach(self, sandbox_id: str) -> FilesSandbox:
        return FilesSandbox(self, super().attach(sandbox_id).box)


@pytest.fixture
def url() -> Iterator[str]:
    with ApiServer(FilesManager(), token=TOKEN, port=0) as srv:  # type: ignore[arg-type]
        yield srv.url


def test_the_routes(url: str) -> None:
    sid = requests.post(f"{url}/v1/sandboxes", json={}, headers=AUTH, timeout=10).json()["id"]
    base = f"{url}/v1/sandboxes/{sid}/files"

    def call(method: str, path: str, **kw: Any) -> requests.Response:
        return requests.request(method, base + path, headers=AUTH, timeout=10, **kw)

    r = call("POST", "/mkdir", json={"path": "/home/a/b"})
    assert r.status_code == 200 and r.json() == {"path": "/home/a/b", "created": True}
    assert call("POST", "/mkdir", json={"path": "/home/a/b"}).json()["created"] is False
    FILES[sid].tree["/home/a/b/f.txt"] = b"hello"
    r = call("GET", "/list", params={"path": "/home", "depth": "3"})
    assert [e["path"] for e in r.json()["entries"]] == ["/home/a/b", "/home/a/b/f.txt"]
    r = call("GET", "/stat", params={"path": "/home/a/b/f.txt", "follow_symlinks": "false"})
    assert r.json()["size"] == 5 and r.json()["type"] == "file"
    assert FILES[sid].calls[-1] == ("stat", ("/home/a/b/f.txt", False))
    r = call("POST", "/rename", json={"src": "/home/a/b/f.txt", "dst": "/home/g.txt"})
    assert r.status_code == 200 and r.json()["path"] == "/home/g.txt"
    r = call("DELETE", "", params={"path": "/home/a"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "file_conflict"
    assert call("DELETE", "", params={"path": "/home/a", "recursive": "true"}).status_code == 204
    assert "/home/a/b" not in FILES[sid].tree
    r = call("GET", "/stat", params={"path": "/home/a"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "file_not_found"


@pytest.mark.parametrize(
    ("method", "path", "kw"),
    [
        ("GET", "/list", {"params": {"path": "/home", "depth": "x"}}),
        ("GET", "/list", {"params": {"path": "/home", "depth": ["1", "2"]}}),
        ("GET", "/list", {"params": {"depth": "1"}}),
        ("GET", "/stat", {"params": {"path": "/home", "follow_symlinks": "yes"}}),
        ("GET", "/stat", {"params": {"path": "/home", "other": "1"}}),
        ("DELETE", "", {"params": {"path": "/home", "recursive": "1"}}),
        ("POST", "/mkdir", {"json": {}}),
        ("POST", "/mkdir", {"json": {"path": 5}}),
        ("POST", "/mkdir", {"json": {"path": "/x", "mode": 493}}),
        ("POST", "/rename", {"json": {"src": "/a"}}),
        ("POST", "/rename", {"json": {"src": "/a", "dst": ["/b"]}}),
    ],
)
def test_bad_requests_are_400_and_touch_nothing(url: str, method: str, path: str, kw: dict[str, Any]) -> None:
    sid = requests.post(f"{url}/v1/sandboxes", json={}, headers=AUTH, timeout=10).json()["id"]
    r = requests.request(method, f"{url}/v1/sandboxes/{sid}/files{path}", headers=AUTH, timeout=10, **kw)
    assert r.status_code == 400, r.text
    assert FILES[sid].calls == []


def test_remote_files_sync_and_async(url: str) -> None:
    with remote.Client(url, token=TOKEN) as client, client.create() as sb:
        assert sb.files.mkdir("/home/w") is True and sb.files.exists("/home/w")
        entry = sb.files.write("/home/w/n.txt", "abc")
        assert (entry.path, entry.size, entry.type) == ("/home/w/n.txt", 3, "file")
        assert [e.name for e in sb.files.list("/home", depth=2)] == ["w", "n.txt"]
        assert sb.files.rename("/home/w/n.txt", "/home/m.txt").size == 3
        sb.files.remove("/home/w")
        assert not sb.files.exists("/home/w")
        with pytest.raises(FileOperationError) as info:
            sb.files.stat("/home/nothing")
        assert info.value.errno == errno.ENOENT
        with pytest.raises(ConfigError):
            sb.files.list("relative")
        with pytest.raises(ConfigError, match="depth"):
            sb.files.list("/home", depth=0)

    async def main() -> None:
        async with remote.AsyncClient(url, token=TOKEN) as c, c.create() as asb:
            assert await asb.files.mkdir("/home/q") is True
            assert [e.path for e in await asb.files.list("/home")] == ["/home/q"]
            await asb.files.remove("/home/q", recursive=True)
            assert not await asb.files.exists("/home/q")

    asyncio.run(main())


GOOD = {"name": "a.txt", "path": "/home/a.txt", "type": "file", "size": 1, "mode": 420, "mtime": 1.0,
        "symlink_target": None}  # fmt: skip


@pytest.mark.parametrize(
    "entry",
    [
        {**GOOD, "name": "../x"},
        {**GOOD, "name": "a/b"},
        {**GOOD, "name": ""},
        {**GOOD, "name": "x" * 256},
        {**GOOD, "path": "relative"},
        {**GOOD, "path": "/a\x00b"},
        {**GOOD, "type": "device"},
        {**GOOD, "size": -1},
        {**GOOD, "size": 1.5},
        {**GOOD, "mode": 0o10000},
        {**GOOD, "mtime": "yesterday"},
        {**GOOD, "symlink_target": 5},
        {k: v for k, v in GOOD.items() if k != "type"},
    ],
)
def test_a_lying_entry_is_refused(entry: dict[str, Any]) -> None:
    assert remote.answers.parse_entry(GOOD).name == "a.txt"
    with pytest.raises(BackendError):
        remote.answers.parse_entry(entry)


def test_a_listing_is_bounded() -> None:
    with pytest.raises(BackendError):
        remote.answers.parse_entry_list({"entries": [GOOD] * 11}, max_entries=10)
    assert len(remote.answers.parse_entry_list({"entries": [GOOD] * 10}, max_entries=10)) == 10
