"""A lying SSH/SFTP server, run INSIDE a sandbox (with the sandbox's python3 and a copy of paramiko),
to prove the host holds when a sandbox answers with anything it likes.

    python3 hostile_sshd.py PORT HOST_KEY_FILE READY_FILE

It accepts any public key. What it answers depends on the path or command the host asks for:

SFTP (``stat`` / ``opendir`` / ``readdir``): every path under ``/hostile`` is a directory whose
listing is chosen by its last component:

- ``traversal-<tag>``: a file named ``../../../../tmp/escape-<tag>``
- ``absolute-<tag>``: a file named ``/tmp/escape-<tag>``
- ``slash``: ``a/b``; ``nul``: ``a\\x00b``; ``long``: a 300-byte name
- ``many-<n>``: n regular files ``f0``, ``f1`` ...
- ``deep``: one directory ``d`` (so ``/hostile/deep/d/d/d...`` never ends)
- ``fine``: ``ok.txt`` (its content comes from the read exchange below)

exec: the host's file read script (``f='<path>'``) is answered by path:

- ``*/lying-size``: says 5 bytes, sends 64 MiB
- ``*/endless``: says 0 bytes (like /proc), sends forever
- ``*/huge-size``: says 10**30 bytes
- ``*/bad-size``: says ``12abc``
- ``*/ok.txt``: says 3, sends ``ok\\n``, exits 0

other commands, by a word they contain:

- ``FLOOD_STDOUT <mib>``: sends that many MiB on stdout (honouring the window), then the real end markers
- ``FLOOD_STDERR <mib>``: the same on stderr, without ever sending the process-group marker
- ``PAST_WINDOW``: sends 64 MiB ignoring the host's receive window
- ``FORGED_MARKERS``: end markers with absurd numbers, then exit status 3
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
import threading

import paramiko
from paramiko import SFTPAttributes, SFTPServer, SFTPServerInterface

MIB = 1 << 20


class Server(paramiko.ServerInterface):
    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return paramiko.OPEN_SUCCEEDED
        return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        text = command.decode("utf-8", "replace")
        if "PAST_WINDOW" in text:
            # 4 MiB before the exec's reply, while the host reads nothing yet: what it buffers stays
            # unread, so its 2 MiB window is exceeded whatever its speed (sent later, from the thread
            # below, the data raced the host's reader, which on a quiet host kept up with it)
            channel.out_window_size = 1 << 40
            send_all(channel, b"z" * (4 << 20))
        threading.Thread(target=answer_exec, args=(channel, text), daemon=True).start()
        return True


def _attrs(name: str, mode: int, size: int = 0) -> SFTPAttributes:
    a = SFTPAttributes()
    a.filename = name
    a.st_mode = mode
    a.st_size = size
    a.st_uid = a.st_gid = 1000
    a.st_atime = a.st_mtime = 0
    return a


def listing(path: str) -> list[SFTPAttributes]:
    last = path.rstrip("/").rsplit("/", 1)[-1]
    reg, dirm = 0o100644, 0o040755
    if last.startswith("traversal-"):
        return [_attrs("../../../../tmp/escape-" + last.split("-", 1)[1], reg, 3)]
    if last.startswith("absolute-"):
        return [_attrs("/tmp/escape-" + last.split("-", 1)[1], reg, 3)]
    if last == "slash":
        return [_attrs("a/b", reg, 3)]
    if last == "nul":
        return [_attrs("a\x00b", reg, 3)]
    if last == "long":
        return [_attrs("x" * 300, reg, 3)]
    if last.startswith("many-"):
        return [_attrs(f"f{i}", reg, 3) for i in range(int(last.split("-", 1)[1]))]
    if last in ("deep", "d"):
        return [_attrs("d", dirm)]
    return [_attrs("ok.txt", reg, 3)]


class HostileSFTP(SFTPServerInterface):
    def stat(self, path: str) -> SFTPAttributes:
        return _attrs(path.rsplit("/", 1)[-1], 0o040755)

    lstat = stat

    def list_folder(self, path: str) -> list[SFTPAttributes]:
        return listing(path)


def send_all(chan: paramiko.Channel, data: bytes, stderr: bool = False) -> None:
    (chan.sendall_stderr if stderr else chan.sendall)(data)


def answer_exec(chan: paramiko.Channel, command: str) -> None:
    try:
        _answer(chan, command)
    except (OSError, EOFError, paramiko.SSHException):
        pass  # the host hung up on us: that is what it should do
    finally:
        with contextlib.suppress(Exception):
            chan.close()


def _answer(chan: paramiko.Channel, command: str) -> None:
    read = re.match(r"f=(\S+);", command)
    if read:
        path = read.group(1).strip("'")
        name = path.rsplit("/", 1)[-1]
        block = b"\0" * MIB
        if name == "lying-size":
            send_all(chan, b"5\n")
            for _ in range(64):
                send_all(chan, block)
        elif name == "endless":
            send_all(chan, b"0\n")
            while True:
                send_all(chan, block)
        elif name == "huge-size":
            send_all(chan, b"1" + b"0" * 30 + b"\n")
        elif name == "bad-size":
            send_all(chan, b"12abc\n")
        else:
            send_all(chan, b"3\nok\n")
        chan.send_exit_status(0)
        return
    token = re.search(r"\\036%sE%s\\036' ([0-9a-f]{24})", command)
    tok = token.group(1).encode() if token else b"?"
    words = command.split()
    if "FLOOD_STDOUT" in command or "FLOOD_STDERR" in command:
        key = "FLOOD_STDOUT" if "FLOOD_STDOUT" in command else "FLOOD_STDERR"
        mib = int(re.search(key + r" (\d+)", command).group(1))  # type: ignore[union-attr]
        block = b"y" * MIB
        for _ in range(mib):
            send_all(chan, block, stderr=key == "FLOOD_STDERR")
        send_all(chan, b"\x1e" + tok + b"E0\x1e")
        send_all(chan, b"\x1e" + tok + b"E\x1e", stderr=True)
        chan.send_exit_status(0)
    elif "PAST_WINDOW" in command:
        chan.out_window_size = 1 << 40  # pretend the host gave a huge window
        block = b"z" * (32 << 10)
        for _ in range(64 * 32):
            send_all(chan, block)
        chan.send_exit_status(0)
    elif "FORGED_MARKERS" in command:
        send_all(chan, b"\x1e" + tok + b"P" + b"9" * 5000 + b"\x1e", stderr=True)
        send_all(chan, b"out\x1e" + tok + b"E" + b"9" * 5000 + b"\x1e")
        send_all(chan, b"\x1e" + tok + b"E\x1e", stderr=True)
        chan.send_exit_status(3)
    else:
        send_all(chan, b"unknown command " + " ".join(words[:3]).encode() + b"\n", stderr=True)
        chan.send_exit_status(127)


def serve(sock: socket.socket, host_key: paramiko.PKey) -> None:
    t = paramiko.Transport(sock)
    t.add_server_key(host_key)
    t.set_subsystem_handler("sftp", SFTPServer, HostileSFTP)
    t.start_server(server=Server())
    while t.is_active():
        t.join(1)


def main() -> None:
    port, key_file, ready = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    host_key = paramiko.Ed25519Key.from_private_key_file(key_file)
    lsock = socket.create_server(("0.0.0.0", port))
    with open(ready + ".tmp", "w") as fh:
        fh.write(str(os.getpid()))
    os.rename(ready + ".tmp", ready)
    while True:
        conn, _ = lsock.accept()
        threading.Thread(target=serve, args=(conn, host_key), daemon=True).start()


if __name__ == "__main__":
    main()
