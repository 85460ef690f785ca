"""Who keeps a connection slot of the HTTP transport when they run out (issue 35, attack 4):
sandbox_rt.web.slots with fakes, then the same rules through a real HttpService on loopback.

A connection that has sent a head with the site's credentials keeps its slot; the others give way
to new connections when the table is full (the oldest first), and one remote address keeps at
most ``max_pending_per_address`` of them. tests/integration/test_http_starvation.py repeats the
attack against the real servers.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from raw_http import WAIT, RawClient, head, poll
from test_web_transport import App, assert_error, serving

from sandbox_rt.web import slots
from sandbox_rt.web.limits import HttpLimits
from sandbox_rt.web.slots import Slots, address_key
from sandbox_rt.web.transport import HttpService, Site

LOOPBACK = ("127.0.0.1", 40000)


class Conn:
    """A fake occupant: remembers that it was evicted."""

    names = itertools.count()

    def __init__(self) -> None:
        self.name = next(self.names)
        self.evictions = 0

    def evict(self) -> None:
        self.evictions += 1

    def __repr__(self) -> str:
        return f"Conn({self.name})"


def table(max_connections: int = 3, per_address: int = 2) -> Slots:
    return Slots(HttpLimits(max_connections=max_connections, max_pending_per_address=per_address))


# -- the table, with fakes -----------------------------------------------------------------------------
def test_a_full_table_evicts_the_oldest_pending_connection_never_a_held_one() -> None:
    t = table()
    a, b, c, d, e = (Conn() for _ in range(5))
    for conn in (a, b, c):
        assert t.admit(conn, LOOPBACK)
    t.hold(a)  # a sent the token: it stays
    assert t.admit(d, LOOPBACK)  # the oldest pending one gives way: b
    assert (a.evictions, b.evictions, c.evictions) == (0, 1, 0) and t.open == 3 and t.evicted == 1
    assert t.admit(e, LOOPBACK)  # then c
    assert c.evictions == 1 and t.open == 3
    t.hold(d)
    t.hold(e)
    assert not t.admit(Conn(), LOOPBACK)  # every slot held: the newcomer is refused
    assert t.refused == 1 and t.evicted == 2 and t.open == 3
    assert a.evictions == d.evictions == e.evictions == 0


def test_a_released_slot_is_free_again_and_release_is_idempotent() -> None:
    t = table(max_connections=1)
    a, b = Conn(), Conn()
    assert t.admit(a, LOOPBACK)
    t.hold(a)
    t.release(a)
    t.release(a)
    t.hold(a)  # a late hold of a closed connection takes nothing
    assert t.open == 0 and t.admit(b, LOOPBACK) and t.open == 1 and not t.evicted


def test_one_remote_address_evicts_its_own_pending_connections_only() -> None:
    t = table(max_connections=10, per_address=2)
    theirs, mine = Conn(), Conn()
    assert t.admit(theirs, ("192.0.2.7", 1))
    assert t.admit(mine, ("192.0.2.9", 1))
    flood = [Conn() for _ in range(5)]
    for conn in flood:
        assert t.admit(conn, ("192.0.2.9", 2))
    assert theirs.evictions == 0 and mine.evictions == 1  # its own oldest, not the other client's
    assert [c.evictions for c in flood] == [1, 1, 1, 0, 0] and t.open == 3
    held = flood[-1]
    t.hold(held)  # a held connection does not count against its address
    assert t.admit(Conn(), ("192.0.2.9", 3)) and held.evictions == 0 and flood[-2].evictions == 0


def test_loopback_has_no_bound_per_address() -> None:
    t = table(max_connections=10, per_address=2)
    local = [Conn() for _ in range(10)]
    for conn in local:
        assert t.admit(conn, LOOPBACK)
    assert not any(c.evictions for c in local) and t.open == 10


@pytest.mark.parametrize(
    ("peer", "key"),
    [
        (("192.0.2.7", 5), "192.0.2.7"),
        (("::ffff:192.0.2.7", 5, 0, 0), "192.0.2.7"),  # an IPv4 client of a dual-stack socket
        (("2001:db8:1:2:aaaa::1", 5, 0, 0), "2001:db8:1:2::/64"),  # one host may own the whole /64
        (("2001:db8:1:2:bbbb::9", 5, 0, 0), "2001:db8:1:2::/64"),
        (("fe80::1%lo", 5, 0, 1), "fe80::/64"),
        (("127.0.0.1", 5), None),
        (("127.8.9.10", 5), None),
        (("::1", 5, 0, 0), None),
        (("::ffff:127.0.0.1", 5, 0, 0), None),
        (None, None),
        ("/run/sock", None),
    ],
)
def test_address_keys(peer: Any, key: str | None) -> None:
    assert address_key(peer) == key


# -- the same rules through the transport --------------------------------------------------------------
TOKEN_HEADER = {"Authorization": "Bearer good"}
LONG = HttpLimits(max_connections=2, header_timeout_s=WAIT, idle_timeout_s=WAIT)  # no deadline runs out here


def token_ok(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    return (b"authorization", b"Bearer good") in [(k, bytes(v)) for k, v in headers]


@pytest.fixture
def app() -> App:
    return App()


@pytest.fixture
def guarded(app: App) -> Iterator[HttpService]:
    with serving(Site(app, "127.0.0.1", 0, credentials=token_ok), limits=LONG) as svc:
        yield svc


def test_a_client_with_the_token_gets_in_when_the_table_is_full(guarded: HttpService, app: App) -> None:
    address = guarded.addresses[0]
    with RawClient(address) as slow, RawClient(address) as silent:
        slow.send(head("GET", "/info")[:-4])  # a head under way, never finished
        poll(lambda: guarded.connections == 2, "both are counted")
        with RawClient(address) as client:
            client.send(head("GET", "/info", TOKEN_HEADER))
            assert client.read_answer().status == 200
            # the oldest without the token made room: it reads the 503 of a full server
            error = assert_error(slow.read_until_closed(), 503, "server_busy")
            assert error["limit"] == 2
            assert silent.still_open(0.2) and guarded.evicted == 1 and guarded.refused == 0
            with RawClient(address) as anonymous:  # no token, a whole request: the silent one gives way
                anonymous.send(head("GET", "/info"))
                assert anonymous.read_answer().status == 200
                assert_error(silent.read_until_closed(), 503, "server_busy")  # its answer, if it asks now
            client.send(head("GET", "/info", TOKEN_HEADER))  # kept its slot throughout
            assert client.read_answer().status == 200
    assert [s.path for s in app.seen] == ["/info"] * 3
    poll(lambda: guarded.connections == 0, "every connection is counted out")


def test_connections_with_the_token_never_give_way(guarded: HttpService) -> None:
    address = guarded.addresses[0]
    with RawClient(address) as first, RawClient(address) as second:
        for c in (first, second):
            c.send(head("GET", "/info", TOKEN_HEADER))
            assert c.read_answer().status == 200
        with RawClient(address) as late:  # even with the token: no slot to take
            late.send(head("GET", "/info", TOKEN_HEADER))
            assert_error(late.read_until_closed(), 503, "server_busy")
        for c in (first, second):
            c.send(head("GET", "/info", TOKEN_HEADER))
            assert c.read_answer().status == 200
        assert guarded.refused == 1 and guarded.evicted == 0


def test_a_request_without_the_token_being_answered_is_cut_when_it_gives_way(
    guarded: HttpService, app: App
) -> None:
    address = guarded.addresses[0]
    with RawClient(address) as streaming, RawClient(address) as other:
        streaming.send(head("GET", "/hang"))  # answered, never finished, no token
        streaming.read_until(b"data: first\n\n")
        other.send(head("GET", "/info", TOKEN_HEADER))
        assert other.read_answer().status == 200
        with RawClient(address) as client:
            client.send(head("GET", "/info", TOKEN_HEADER))
            assert client.read_answer().status == 200
            rest = streaming.read_until_closed()  # cut: no 503 inside a response (the chunk's CRLF at most)
            assert rest is not None and rest in (b"", b"\r\n"), rest
        assert guarded.evicted == 1


def test_one_remote_address_gives_way_to_itself_not_to_others(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loopback has no bound per address; the test names two clients by their ports instead."""
    theirs: set[int] = set()
    monkeypatch.setattr(slots, "address_key", lambda peer: "them" if peer[1] in theirs else "me")
    limits = HttpLimits(max_connections=10, max_pending_per_address=2, header_timeout_s=WAIT)
    with serving(Site(app, "127.0.0.1", 0, credentials=token_ok), limits=limits) as svc:
        address = svc.addresses[0]
        with RawClient(address) as mine:
            mine.send(head("GET", "/info")[:-4])
            poll(lambda: svc.connections == 1, "counted")
            flood = []
            try:
                for _ in range(3):
                    c = RawClient(address)
                    theirs.add(c.sock.getsockname()[1])
                    c.send(head("GET", "/info")[:-4])
                    flood.append(c)
                    poll(lambda: svc.connections + svc.evicted == 1 + len(flood), "counted")
                assert_error(flood[0].read_until_closed(), 503, "server_busy")  # their own oldest
                assert mine.still_open(0.2) and flood[1].still_open(0) and flood[2].still_open(0)
                assert svc.evicted == 1
            finally:
                for c in flood:
                    c.close()
