"""Connecting to a booting sandbox: an unanswered SYN is retried at once, not after the kernel's 1 s.

Real sockets on loopback: a listener whose accept queue is full drops further SYNs, which is what a
lost first SYN looks like to the client.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import paramiko
import pytest

from sandbox_rt import ssh
from sandbox_rt.errors import SandboxNotReady
from sandbox_rt.ssh import connection as connection_module
from sandbox_rt.ssh import wire


@pytest.fixture
def full_listener() -> Iterator[socket.socket]:
    """A loopback listener with backlog 0 and one unaccepted connection: new SYNs are dropped."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    filler = socket.create_connection(srv.getsockname())
    yield srv
    filler.close()
    srv.close()


def test_an_unanswered_syn_is_sent_again_within_the_syn_timeout(
    full_listener: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts: list[float] = []
    real = wire.tcp_connect

    def counting(host: str, port: int, timeout: float) -> socket.socket:
        attempts.append(timeout)
        return real(host, port, timeout)

    monkeypatch.setattr(wire, "tcp_connect", counting)
    freed: list[socket.socket] = []
    opener = threading.Timer(0.5, lambda: freed.append(full_listener.accept()[0]))  # room after 0.5 s
    opener.start()
    key = paramiko.RSAKey.generate(1024)
    executor = ssh.SSHExecutor(
        "127.0.0.1", port=full_listener.getsockname()[1], user="u", key=key, host_key=key
    )
    try:
        with pytest.raises(SandboxNotReady):  # TCP gets through; the listener never speaks SSH
            executor.connect(timeout_s=1.2)
    finally:
        opener.join()
        for conn in freed:
            conn.close()
    # with the kernel's retransmission alone there would be one attempt, answered after 1 s
    assert len(attempts) >= 3, attempts
    assert attempts[0] == pytest.approx(connection_module._SYN_TIMEOUT_S)
