"""Beyond the seeds (issue 10): TTL extend, detached sandboxes, background processes, port exposure."""

from __future__ import annotations

import socket
import time

import pytest

import sandbox_rt
from sandbox_rt import CommandTimeout, Manager


def test_extend_moves_the_expiry(manager: Manager, make) -> None:  # type: ignore[no-untyped-def]
    sb = make(ttl_s=60)
    sb.extend(3600)
    assert sb.expires_at is not None and 3590 < sb.expires_at - time.time() <= 3600
    assert manager.get(sb.id).expires_at == sb.expires_at  # stored with the sandbox
    with pytest.raises(sandbox_rt.ConfigError):
        sb.extend(-1)


def test_detached_sandbox_survives_dead_owner_gc(lxc_manager: Manager, make_lxc) -> None:  # type: ignore[no-untyped-def]
    sb = make_lxc(detached=True)
    assert lxc_manager.get(sb.id).owner_pid == 0
    removed = {r.sandbox_id for r in lxc_manager.gc(dead_owners=True, dry_run=True)}
    assert sb.id not in removed


def test_background_process_wait_logs_kill(sandbox: sandbox_rt.Sandbox) -> None:
    # returns while the command runs: it ends when the test lets it (a condition, not a clock), or by
    # itself after 60 s, so a start that waited for it would find it ended
    bg = sandbox.exec(
        "echo start; for i in $(seq 600); do [ -e /tmp/go ] && break; sleep 0.1; done; echo done >&2; exit 7",
        background=True,
    )
    assert bg.pid > 1 and bg.info().running
    sandbox.exec("touch /tmp/go")
    assert bg.wait(timeout=20) == 7
    ended = bg.info()
    assert (ended.pid, ended.running, ended.exit_code, ended.command) == (bg.pid, False, 7, bg.command)
    out, err = bg.logs()
    assert out == b"start\n" and err == b"done\n"
    assert bg.logs() == (b"", b"")  # incremental: nothing new

    long = sandbox.exec("sleep 300", background=True)
    assert long.is_running()
    assert (long.info().running, long.info().exit_code) == (True, None)
    with pytest.raises(CommandTimeout):
        long.wait(timeout=0.5)
    long.kill()
    assert long.wait(timeout=20) != 0
    assert "sleep 300" not in sandbox.exec("ps -eo args").text


def test_background_survives_the_connection(manager: Manager, sandbox: sandbox_rt.Sandbox) -> None:
    bg = sandbox.exec("sleep 1; echo survived", background=True)
    sandbox.close()  # the SSH transport goes away
    again = manager.attach(sandbox.id)
    from sandbox_rt.background import BackgroundProcess

    handle = BackgroundProcess(again, bg.handle, bg.pid, bg.command)
    assert handle.wait(timeout=20) == 0
    assert handle.logs()[0] == b"survived\n"
    again.close()


def test_expose_forwards_a_host_port_to_the_sandbox(sandbox: sandbox_rt.Sandbox) -> None:
    server = (
        "import socket\n"
        "s = socket.create_server(('0.0.0.0', 8080))\n"
        "while True:\n"
        "    c, _ = s.accept(); d = c.recv(100); c.sendall(b'echo:' + d); c.close()\n"
    )
    sandbox.write_file("/tmp/srv.py", server)
    sandbox.exec("python3 /tmp/srv.py", background=True)
    fwd = sandbox.expose(8080)
    assert fwd.host == "127.0.0.1"
    deadline = time.monotonic() + 10
    while True:  # poll until the server in the sandbox listens
        try:
            with socket.create_connection((fwd.host, fwd.port), timeout=2) as c:
                c.sendall(b"hi")
                c.shutdown(socket.SHUT_WR)
                reply = c.recv(100)
            if reply:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, "forward never answered"
        time.sleep(0.05)
    assert reply == b"echo:hi"
    sandbox.close()  # forwards end with the connection
    with pytest.raises(OSError):
        socket.create_connection((fwd.host, fwd.port), timeout=2).close()
    with pytest.raises(sandbox_rt.ConfigError):
        sandbox.expose(70000)
