"""An in-process SSH server with an SFTP subsystem over a small in-memory file system, answering the
way OpenSSH's sftp-server does, and lying when a test asks it to.

The file system (:class:`World`) computes the errno a Linux kernel would give for each request, then
answers with the status OpenSSH's ``errno_to_portable`` makes of it: "no such file" for ENOENT and
ENOTDIR, "permission denied" for EACCES, BAD_MESSAGE for EINVAL and ENAMETOOLONG, FAILURE for the
rest. ``World.errors`` keeps the errnos it computed, so a test can compare what the host made of the
answer with the truth.

The lies (set on the world): ``fail`` answers an operation with a status whatever the file system
says; ``lies`` answers ``stat``/``lstat`` of a path with given attributes (or a status); ``listing``
answers a directory listing with given names; ``text`` replaces every error status's text;
``extended_lie`` sends an ATTRS reply whose extended-attribute count is 2**32 - 1 with no pairs;
``readdir_lie`` a NAME reply that promises 2**32 - 1 names and holds one.

Mounts (``World.mounts``: mount point -> read-only) are served as ``/proc/self/mountinfo`` and
refuse what Linux refuses: a rename from one to another (EXDEV), a mount point removed or moved
(EBUSY), a change on a read-only one (EROFS). ``links`` are symbolic links (their targets as bytes).
"""

from __future__ import annotations

import errno
import io
import logging
import os
import posixpath
import socket
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from paramiko.sftp import CMD_ATTRS, CMD_NAME, SFTP_OK
from paramiko.sftp_attr import SFTPAttributes

from sandbox_rt.ssh import SSHExecutor

DIR, REG = stat.S_IFDIR | 0o755, stat.S_IFREG | 0o644
logging.getLogger("lying-sftp").setLevel(logging.CRITICAL + 1)


def portable(code: int) -> int:
    """OpenSSH sftp-server's ``errno_to_portable``."""
    if code in (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP):
        return paramiko.sftp.SFTP_NO_SUCH_FILE
    if code in (errno.EPERM, errno.EACCES, errno.EFAULT):
        return paramiko.sftp.SFTP_PERMISSION_DENIED
    if code in (errno.ENAMETOOLONG, errno.EINVAL):
        return paramiko.sftp.SFTP_BAD_MESSAGE
    return paramiko.sftp.SFTP_FAILURE


@dataclass
class World:
    """The server's file system (``{path: mode}``, "/" always a directory) and its lies."""

    entries: dict[str, int] = field(default_factory=lambda: {"/": DIR})
    fail: dict[str, int] = field(default_factory=dict)  # op -> SFTP status, whatever the truth
    lies: dict[str, SFTPAttributes | int] = field(default_factory=dict)  # path -> stat answer
    listing: dict[str, list[str]] = field(default_factory=dict)  # directory -> names it lists
    text: bytes | None = None
    extended_lie: bool = False
    readdir_lie: bool = False
    mounts: dict[str, bool] = field(default_factory=lambda: {"/": False})  # point -> read-only
    links: dict[str, bytes] = field(default_factory=dict)  # path -> the link's target
    errors: list[tuple[str, int]] = field(default_factory=list)  # (op, the errno it computed)
    requests: list[tuple[str, str]] = field(default_factory=list)  # (op, path) as they came

    def add(self, *paths: str) -> None:
        """Directories end with "/", files do not; parents are made."""
        for path in paths:
            is_dir = path.endswith("/")
            path = path.rstrip("/") or "/"
            parent = posixpath.dirname(path)
            if parent not in self.entries:
                self.add(parent + "/")
            self.entries[path] = DIR if is_dir else REG

    def children(self, path: str) -> list[str]:
        top = path.rstrip("/") + "/"
        return [p for p in self.entries if p.startswith(top) and "/" not in p[len(top) :]]

    # -- what Linux would say --------------------------------------------------------------------
    def lookup(self, path: str) -> int:
        """0 if ``path`` is there, else the errno of walking to it."""
        if any(len(name.encode()) > 255 for name in path.split("/")):
            return errno.ENAMETOOLONG
        parts = [p for p in path.split("/") if p]
        here = "/"
        for i, name in enumerate(parts):
            here = posixpath.join(here, name)
            if here not in self.entries:
                return errno.ENOENT
            if i < len(parts) - 1 and not stat.S_ISDIR(self.entries[here]):
                return errno.ENOTDIR
        return 0

    def _parent(self, path: str) -> int:
        """0 if ``path``'s parent is a directory, else the errno of walking to it."""
        if len(posixpath.basename(path).encode()) > 255:
            return errno.ENAMETOOLONG
        parent = posixpath.dirname(path)
        code = self.lookup(parent)
        if code == 0 and not self.is_dir(parent):
            return errno.ENOTDIR
        return code

    def is_dir(self, path: str) -> bool:
        return stat.S_ISDIR(self.entries.get(path, 0))

    def mount_of(self, path: str) -> str:
        """The mount point that holds ``path`` (the deepest at or above it)."""
        return max((m for m in self.mounts if path == m or path.startswith(m.rstrip("/") + "/")), key=len)

    def _change(self, path: str, *, entry: bool) -> int:
        """EBUSY if the change removes or replaces a mount point (``entry``); EROFS on a read-only
        mount."""
        if entry and path in self.mounts:
            return errno.EBUSY
        return errno.EROFS if self.mounts[self.mount_of(path)] else 0

    def mountinfo(self) -> bytes:
        """The mounts as the kernel lists them (a space in a mount point written as \\040)."""
        lines = []
        for i, (point, read_only) in enumerate(self.mounts.items()):
            where = point.replace(" ", "\\040")
            lines.append(
                f"{i + 20} 1 0:{i} / {where} {'ro' if read_only else 'rw'},relatime - ext4 /dev/x rw\n"
            )
        return "".join(lines).encode()

    def open_write(self, path: str) -> int:
        if path.endswith("/") and path != "/":  # creat("name/"): what Linux says
            return errno.EISDIR
        code = self._parent(path) or self._change(path, entry=False)
        if code:
            return code
        if self.is_dir(path):
            return errno.EISDIR
        self.entries[path] = REG
        return 0

    def unlink(self, path: str) -> int:
        code = self.lookup(path)
        if code:
            return code
        if self.is_dir(path):
            return errno.EISDIR
        code = self._change(path, entry=True)
        if code:
            return code
        del self.entries[path]
        return 0

    def rmdir(self, path: str) -> int:
        code = self.lookup(path)
        if code:
            return code
        if not self.is_dir(path):
            return errno.ENOTDIR
        code = self._change(path, entry=True)
        if code:
            return code
        if self.children(path):
            return errno.ENOTEMPTY
        del self.entries[path]
        return 0

    def mkdir(self, path: str) -> int:
        code = self._parent(path)
        if code:
            return code
        if path in self.entries:
            return errno.EEXIST
        code = self._change(path, entry=False)
        if code:
            return code
        self.entries[path] = DIR
        return 0

    def rename(self, src: str, dst: str) -> int:
        code = self.lookup(src) or self._parent(dst)
        if code:
            return code
        if self.mount_of(posixpath.dirname(src)) != self.mount_of(posixpath.dirname(dst)):
            return errno.EXDEV
        code = self._change(src, entry=True) or self._change(dst, entry=True)
        if code:
            return code
        if self.is_dir(src) and (dst == src or dst.startswith(src.rstrip("/") + "/")):
            return 0 if dst == src else errno.EINVAL
        if dst in self.entries:
            if self.is_dir(src) and not self.is_dir(dst):
                return errno.ENOTDIR
            if not self.is_dir(src) and self.is_dir(dst):
                return errno.EISDIR
            if self.is_dir(dst) and self.children(dst):
                return errno.ENOTEMPTY
        moved = {p: m for p, m in self.entries.items() if p == src or p.startswith(src + "/")}
        for p in moved:
            del self.entries[p]
        self.entries.pop(dst, None)
        self.entries.update({dst + p[len(src) :]: m for p, m in moved.items()})
        return 0


class _File(paramiko.SFTPHandle):
    def __init__(self, flags: int, data: bytes = b"") -> None:
        super().__init__(flags)
        self.data = data

    def read(self, offset: int, length: int) -> bytes:
        return self.data[offset : offset + length]

    def write(self, offset: int, data: bytes) -> int:
        return SFTP_OK

    def chattr(self, attr: SFTPAttributes) -> int:
        return SFTP_OK


class _FileSystem(paramiko.SFTPServerInterface):
    def __init__(self, server: paramiko.ServerInterface, world: World) -> None:
        super().__init__(server)
        self.world = world

    def _answer(self, op: str, path: str, code: int) -> int:
        self.world.requests.append((op, path))
        forced = self.world.fail.get(op)
        if forced is not None:
            return forced
        self.world.errors.append((op, code))
        return SFTP_OK if code == 0 else portable(code)

    def _stat(self, op: str, path: str) -> SFTPAttributes | int:
        self.world.requests.append((op, path))
        if path in self.world.lies:
            return self.world.lies[path]
        code = self.world.lookup(path)
        if code:
            return portable(code)
        return SFTPAttributes.from_stat(os_stat(self.world.entries[path]), posixpath.basename(path))

    def stat(self, path: str) -> SFTPAttributes | int:
        return self._stat("stat", path)

    def lstat(self, path: str) -> SFTPAttributes | int:
        return self._stat("lstat", path)

    def open(self, path: str, flags: int, attr: SFTPAttributes) -> paramiko.SFTPHandle | int:
        if path == "/proc/self/mountinfo" and not flags & (os.O_WRONLY | os.O_RDWR):
            self.world.requests.append(("mountinfo", path))
            return _File(flags, self.world.mountinfo())
        code = self._answer("open", path, self.world.open_write(path))
        return _File(flags) if code == SFTP_OK else code

    def remove(self, path: str) -> int:
        return self._answer("remove", path, self.world.unlink(path))

    def rmdir(self, path: str) -> int:
        return self._answer("rmdir", path, self.world.rmdir(path))

    def mkdir(self, path: str, attr: SFTPAttributes) -> int:
        return self._answer("mkdir", path, self.world.mkdir(path))

    def posix_rename(self, oldpath: str, newpath: str) -> int:
        return self._answer("rename", oldpath, self.world.rename(oldpath, newpath))

    def list_folder(self, path: str) -> list[SFTPAttributes] | int:
        self.world.requests.append(("opendir", path))
        names = self.world.listing.get(path)
        if names is None:
            code = self.world.lookup(path) or (0 if self.world.is_dir(path) else errno.ENOTDIR)
            if code:
                return portable(code)
            names = [".", "..", *(posixpath.basename(p) for p in self.world.children(path))]
        return [SFTPAttributes.from_stat(os_stat(REG), name) for name in names]

    def canonicalize(self, path: str) -> str:
        return posixpath.normpath(path)

    def readlink(self, path: str) -> bytes | int:
        target = self.world.links.get(path)
        return paramiko.sftp.SFTP_NO_SUCH_FILE if target is None else target


def os_stat(mode: int) -> Any:
    """What ``SFTPAttributes.from_stat`` reads, for an entry of ``mode``."""
    return SimpleNamespace(st_mode=mode, st_size=0, st_uid=0, st_gid=0, st_atime=0, st_mtime=0)


class _SFTPServer(paramiko.SFTPServer):
    def _response(self, request_number: int, t: int, *args: Any) -> None:
        world: World = self.server.world  # type: ignore[attr-defined]
        if t != CMD_ATTRS or not world.extended_lie:
            super()._response(request_number, t, *args)
            return
        msg = paramiko.Message()  # attributes that promise 2**32 - 1 extended pairs and hold none
        msg.add_int(request_number)
        msg.add_int(SFTPAttributes.FLAG_PERMISSIONS | SFTPAttributes.FLAG_EXTENDED)
        msg.add_int(DIR)
        msg.add_int(0xFFFFFFFF)
        self._send_packet(CMD_ATTRS, msg)

    def _send_status(self, request_number: int, code: int, desc: Any = None) -> None:
        world: World = self.server.world  # type: ignore[attr-defined]
        if world.text is not None and code not in (SFTP_OK, paramiko.sftp.SFTP_EOF):
            desc = world.text
        super()._send_status(request_number, code, desc)

    def _read_folder(self, request_number: int, folder: paramiko.SFTPHandle) -> None:
        world: World = self.server.world  # type: ignore[attr-defined]
        if not world.readdir_lie:
            super()._read_folder(request_number, folder)
            return
        msg = paramiko.Message()
        msg.add_int(request_number)
        msg.add_int(0xFFFFFFFF)
        msg.add_string(b"x")
        msg.add_string(b"x")
        SFTPAttributes.from_stat(os_stat(REG))._pack(msg)
        self._send_packet(CMD_NAME, msg)


class _Server(paramiko.ServerInterface):
    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return paramiko.OPEN_SUCCEEDED
        return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED


def _ed25519() -> paramiko.Ed25519Key:
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    return paramiko.Ed25519Key.from_private_key(io.StringIO(pem.decode()))


@contextmanager
def lying_sftp(world: World) -> Iterator[SSHExecutor]:
    """An executor connected to an in-process server whose SFTP answers from ``world``."""
    host_key = _ed25519()
    listener = socket.create_server(("127.0.0.1", 0))
    transports: list[paramiko.Transport] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(conn)
            transport.set_log_channel("lying-sftp")  # quiet: the client going away is no news
            transport.add_server_key(host_key)
            transport.set_subsystem_handler("sftp", _SFTPServer, _FileSystem, world)
            transports.append(transport)
            transport.start_server(server=_Server())

    thread = threading.Thread(target=serve, name="lying-sftp", daemon=True)
    thread.start()
    public = paramiko.Ed25519Key(data=host_key.asbytes())
    executor = SSHExecutor(
        "127.0.0.1", port=listener.getsockname()[1], user="u", key=_ed25519(), host_key=public
    )
    try:
        executor.connect(10)
        yield executor
    finally:
        executor.close()
        with suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone does not)
        listener.close()
        thread.join(5)
        for transport in transports:
            transport.close()
