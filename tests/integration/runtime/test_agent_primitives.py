"""What agents expect beyond exec (issue 17, items 4-6): ``sb.files``, ``sb.commands`` with
background processes (list, reattach by pid from another process, stdin, kill), and an interactive
terminal (``sb.pty`` and ``sandbox-rt shell`` driven through tmux as a person would). Both backends.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import sandbox_rt
from sandbox_rt import ConfigError, FileOperationError, Manager

from .conftest import SESSION_LABEL, Factory, settings_environ

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def sb(manager: Manager) -> Iterator[sandbox_rt.Sandbox]:
    with manager.create(labels=SESSION_LABEL, memory_mb=512) as box:
        yield box


# -- files -------------------------------------------------------------------------------------------
def test_files_list_stat_exists_mkdir_rename_remove(sb: sandbox_rt.Sandbox) -> None:
    f = sb.files
    assert f.mkdir("/home/sandbox/t/a/b") is True and f.mkdir("/home/sandbox/t/a/b") is False
    assert f.write("/home/sandbox/t/a/b/x.txt", "hello").size == 5
    sb.exec("ln -sfn /etc/passwd /home/sandbox/t/link && mkfifo /home/sandbox/t/fifo", check=True)
    one = f.list("/home/sandbox/t")
    assert [(e.name, e.type) for e in one] == [("a", "dir"), ("fifo", "other"), ("link", "symlink")]
    assert one[2].symlink_target == "/etc/passwd" and one[2].path == "/home/sandbox/t/link"
    deep = [e.path for e in f.list("/home/sandbox/t", depth=3)]
    assert "/home/sandbox/t/a/b/x.txt" in deep and len(deep) == 5
    st = f.stat("/home/sandbox/t/a/b/x.txt")
    assert (st.type, st.size, st.mode) == ("file", 5, 0o644) and st.mtime > 0
    assert f.stat("/home/sandbox/t/link").type == "file"  # followed inside the sandbox
    assert f.stat("/home/sandbox/t/link", follow_symlinks=False).type == "symlink"
    assert f.exists("/home/sandbox/t/link") and not f.exists("/home/sandbox/t/nope")
    moved = f.rename("/home/sandbox/t/a/b/x.txt", "/home/sandbox/t/y.txt")
    assert moved.path == "/home/sandbox/t/y.txt" and f.read("/home/sandbox/t/y.txt") == b"hello"
    f.remove("/home/sandbox/t/link")  # the link, not /etc/passwd
    assert sb.exec("test -s /etc/passwd").exit_code == 0
    with pytest.raises(FileOperationError):
        f.remove("/home/sandbox/t/a")  # not empty
    f.remove("/home/sandbox/t", recursive=True)
    assert not f.exists("/home/sandbox/t")
    f.remove("/home/sandbox/t")  # absent is fine
    with pytest.raises(FileOperationError) as refused:  # never /: a file error (HTTP 403), not a bad argument
        f.remove("/", recursive=True)
    assert refused.value.errno == errno.EPERM
    with pytest.raises(FileOperationError) as caught:
        f.stat("/home/sandbox/nope")
    assert caught.value.errno == 2


def test_a_fifo_planted_at_the_path_cannot_hold_a_write(sb: sandbox_rt.Sandbox) -> None:
    """The sandbox's SFTP server blocks for ever in open() on a FIFO: the write gives up after the
    reply timeout with ETIMEDOUT (HTTP 504 file_timeout), and the next file operation works on a
    fresh SFTP session."""
    sb.exec("mkfifo /tmp/trap", check=True)
    sb._ssh.sftp_reply_timeout_s = 1.0  # the default (60 s) is the same code path, slower
    t0 = time.monotonic()
    with pytest.raises(FileOperationError) as stuck:
        sb.write_file("/tmp/trap", b"x")
    assert stuck.value.errno == errno.ETIMEDOUT and time.monotonic() - t0 < 10
    sb.write_file("/tmp/after-trap", b"ok")
    assert sb.read_file("/tmp/after-trap") == b"ok"


def test_files_list_is_bounded(sb: sandbox_rt.Sandbox) -> None:
    sb.exec("mkdir -p /tmp/many && cd /tmp/many && touch $(seq 1 300)", check=True)
    assert len(sb.files.list("/tmp/many")) == 300
    with pytest.raises(FileOperationError) as caught:
        sb.files.list("/tmp/many", max_entries=100)
    assert caught.value.errno == 7  # E2BIG


# -- commands and background processes ------------------------------------------------------------
def test_background_stdin_list_and_reattach_from_another_process(
    manager: Manager, sb: sandbox_rt.Sandbox
) -> None:
    bg = sb.commands.run("tr a-z A-Z; echo done", background=True)
    assert any(
        p.pid == bg.pid and p.running and p.command == "tr a-z A-Z; echo done" for p in sb.commands.list()
    )
    sb.commands.send_stdin(bg.pid, "hello\n")
    # another process attaches by id and reattaches to the command by pid
    script = (
        "import sys, sandbox_rt\n"
        "sb = sandbox_rt.Manager.from_env().attach(sys.argv[1])\n"
        "p = sb.commands.connect(int(sys.argv[2]))\n"
        "p.send_stdin('again\\n'); p.close_stdin(); print(p.wait(timeout=20)); print(p.logs()[0].decode())\n"
    )
    env = settings_environ(manager.settings)
    out = subprocess.run(
        [sys.executable, "-c", script, sb.id, str(bg.pid)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "HELLO", "AGAIN", "done"]
    ended = next(p for p in sb.commands.list() if p.pid == bg.pid)
    assert not ended.running and ended.exit_code == 0
    with pytest.raises(sandbox_rt.SandboxError, match="ended"):
        sb.commands.send_stdin(bg.pid, "late\n")


def test_background_reattach_close_stdin_and_kill(manager: Manager, sb: sandbox_rt.Sandbox) -> None:
    bg = sb.commands.run("cat > /tmp/got; sleep 300", background=True)
    again = manager.attach(sb.id)  # a second connection, as another process would have
    try:
        handle = again.commands.connect(bg.pid)
        handle.send_stdin(b"\x00\x01binary")
        handle.close_stdin()
        with pytest.raises(sandbox_rt.SandboxError, match="closed"):
            handle.send_stdin("more")
        for _ in range(100):  # cat saw EOF and wrote the file: poll for it
            if sb.exec("test -s /tmp/got").exit_code == 0:
                break
            time.sleep(0.05)
        assert sb.read_file("/tmp/got") == b"\x00\x01binary"
        again.commands.kill(bg.pid)
        assert bg.wait(timeout=20) == 137
        assert "sleep 300" not in sb.exec("ps -eo args").text
        with pytest.raises(sandbox_rt.SandboxError, match="no background command"):
            again.commands.connect(99999)
        with pytest.raises(ConfigError):
            again.commands.connect(1)
    finally:
        again.close()


# -- terminal -----------------------------------------------------------------------------------------
def _until(t: sandbox_rt.pty.Pty, needle: bytes, timeout: float = 20) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen and time.monotonic() < deadline and not t.closed:
        seen += t.read(timeout=0.5)
    assert needle in seen, seen[-500:]
    return seen


def test_pty_runs_a_shell_with_input_resize_and_exit_status(sb: sandbox_rt.Sandbox) -> None:
    with sb.pty(100, 30) as t:
        t.write("stty size; tty; echo $((6*7))-end\n")
        out = _until(t, b"42-end")  # not "42": a sandbox id may contain it (the prompt shows the id)
        assert b"30 100" in out and b"/dev/pts/" in out
        t.resize(120, 40)
        t.write("stty size\n")
        _until(t, b"40 120")
        t.write("sleep 101\n")
        for _ in range(200):  # until the sleep runs (a Ctrl-C before would hit the shell)
            if sb.exec("pgrep -x -f 'sleep 101'").exit_code == 0:
                break
            time.sleep(0.05)
        t.write("\x03")  # Ctrl-C reaches the program in the terminal
        t.write("echo after-$((1+1))\n")
        _until(t, b"after-2")
        t.write("exit 7\n")
        assert t.wait(timeout=20) == 7 and t.closed
    with sb.pty(command="echo one-shot") as t:
        assert t.wait(timeout=20) == 0
    with pytest.raises(ConfigError):
        sb.pty(0, 24)


def test_sandbox_rt_shell_in_tmux(manager: Manager, make: Factory) -> None:
    """A person's terminal: type, read the screen, resize the window, leave (tmux comes with
    scripts/bootstrap.sh). A tmux server of its own (-L), started with this backend's settings."""
    assert shutil.which("tmux"), "tmux is missing: run scripts/bootstrap.sh"
    box = make(memory_mb=512)
    sock = f"sbxshell{os.getpid()}"
    cli = REPO / ".venv" / "bin" / "sandbox-rt"

    def tmux(*args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", sock, *args],
            capture_output=True,
            text=True,
            check=True,
            env=settings_environ(manager.settings),
            timeout=30,
        ).stdout

    def wait_for(text: str) -> None:
        deadline = time.monotonic() + 30
        while text not in (shown := tmux("capture-pane", "-t", "s", "-p")):
            assert time.monotonic() < deadline, shown
            time.sleep(0.1)  # polling the screen for what the shell printed

    tmux(
        "new-session",
        "-d",
        "-s",
        "s",
        "-x",
        "100",
        "-y",
        "30",
        f"{cli} shell {box.id}; echo shell-exit=$?; sleep 30",
    )
    try:
        wait_for(f"sandbox@{box.hostname}")
        tmux("send-keys", "-t", "s", "echo typed-$((40+2)); stty size", "Enter")
        wait_for("typed-42")
        wait_for("30 100")
        tmux("resize-window", "-t", "s", "-x", "120", "-y", "40")
        # the new size travels SIGWINCH -> sandbox-rt shell -> SSH window-change, beside the keys
        # tmux types (a person typing right after a resize races it too): ask until it has arrived
        deadline = time.monotonic() + 30
        while True:
            tmux("send-keys", "-t", "s", "stty size", "Enter")
            asked = time.monotonic()
            while "40 120" not in (shown := tmux("capture-pane", "-t", "s", "-p")):
                if time.monotonic() - asked > 1:
                    break
                time.sleep(0.1)  # polling the screen for what the shell printed
            if "40 120" in shown:
                break
            assert time.monotonic() < deadline, shown
        tmux("send-keys", "-t", "s", "exit 5", "Enter")
        wait_for("shell-exit=5")
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True, timeout=30)
