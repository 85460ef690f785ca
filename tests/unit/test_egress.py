"""Egress allow-lists: classifying and checking entries, and what the runtime writes for nft and for
the per-sandbox resolvers (no host: nft and dnsmasq are faked where the runtime would call them)."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandbox_rt import BackendError, ConfigError, Settings
from sandbox_rt.backends.lxc.egress_dns import EgressResolvers
from sandbox_rt.backends.lxc.netstate import NetState, SandboxNet
from sandbox_rt.validation import check_egress, egress_entry, make_spec, split_egress


def test_entries_are_normalised() -> None:
    got = check_egress(["Example.ORG.", "*.api.example.org", "192.0.2.0/24", "198.51.100.7", "example.org"])
    assert got == ("example.org", "api.example.org", "192.0.2.0/24", "198.51.100.7")
    assert split_egress(got) == (["192.0.2.0/24", "198.51.100.7"], ["example.org", "api.example.org"])
    assert check_egress(["198.51.100.7/32"]) == ("198.51.100.7",)
    assert check_egress(None) == () and check_egress([]) == ()
    assert make_spec(egress=["example.org"]).egress == ("example.org",)


@pytest.mark.parametrize(
    ("entry", "kind", "norm"),
    [
        ("1password.com", "name", "1password.com"),
        ("1e100.net", "name", "1e100.net"),
        ("3m.com", "name", "3m.com"),
        ("123.com", "name", "123.com"),
        ("0x7f.example", "name", "0x7f.example"),
        ("9gag.co.uk.", "name", "9gag.co.uk"),
        ("*.1password.com", "name", "1password.com"),
        ("10.0.0.1", "network", "10.0.0.1"),
        ("10.0.0.0/8", "network", "10.0.0.0/8"),
        ("10.0.0.1/32", "network", "10.0.0.1"),
        ("0.0.0.0/1", "network", "0.0.0.0/1"),
        ("255.255.255.255", "network", "255.255.255.255"),
    ],
)
def test_entries_are_classified_by_parsing_not_by_their_first_character(
    entry: str, kind: str, norm: str
) -> None:
    assert egress_entry(entry) == (kind, norm)
    nets, names = split_egress(check_egress([entry]))
    assert (nets, names) == (([norm], []) if kind == "network" else ([], [norm]))


@pytest.mark.parametrize(
    "entry",
    # digits and dots only: an address or nothing (never a name, never inet_aton's reading)
    [
        "1.2.3",
        "01.2.3.4",
        "1.2.3.4.5",
        "999.1.1.1",
        "127.1",
        "1.2.3.0/08",
        "1.2.3.4/33",
        "1.2.3.0/255.255.255.0",
        "1..2.3",
        ".1.2.3.4",
        "1.2.3.4.",
        "1.2.3.4/",
        "/8",
        "12345",
    ],
)
def test_address_lookalikes_are_refused_as_addresses(entry: str) -> None:
    with pytest.raises(ConfigError, match="not an IPv4 address or network"):
        egress_entry(entry)


@pytest.mark.parametrize(
    ("egress", "words"),
    [
        ("example.org", "must be a list"),
        ([""], "non-empty"),
        ([None], "non-empty"),
        (["2001:db8::/32"], "IPv6"),
        (["192.0.2.1/24"], "host bits"),
        (["0.0.0.0/0"], "internet=True"),
        (["300.1.2.3"], "not an IPv4"),
        (["localhost"], "domain name"),
        (["bad_name.example"], "domain name"),
        (["a.-b.example"], "domain name"),
        (["exa mple.org"], "domain name"),
        (["com.123"], "domain name"),
        (["1.2.3.4.5x"], "domain name"),
        (["evil.org/4#inet#sandbox#internet_allowed"], "domain name"),
        (["x.org\nnftset=/y/"], "domain name"),
        (["example.org\n"], "domain name"),
        ([" example.org"], "domain name"),
        (["192.0.2.7\n"], "domain name"),
        (["a.org\x00"], "non-empty"),
        ([f"h{i}.example" for i in range(65)], "at most 64"),
    ],
)
def test_bad_entries_are_config_errors(egress: object, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        check_egress(egress)  # type: ignore[arg-type]


def test_split_refuses_what_check_would_refuse() -> None:
    # a backend handed an unchecked list fails before it writes anything
    with pytest.raises(ConfigError):
        split_egress(("192.0.2.0/24", "bad entry"))


_LABEL = st.from_regex(r"[a-z0-9](?:[a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
_TLD = st.from_regex(r"[a-z][a-z0-9-]{0,8}[a-z0-9]", fullmatch=True)


@given(st.lists(_LABEL, min_size=1, max_size=4), _TLD)
def test_any_name_with_a_letter_top_label_is_a_name(labels: list[str], tld: str) -> None:
    name = ".".join([*labels, tld])
    assert egress_entry(name.upper()) == ("name", name)


@given(st.ip_addresses(v=4), st.integers(min_value=1, max_value=32))
def test_any_ipv4_network_is_a_network(address: ipaddress.IPv4Address, prefix: int) -> None:
    net = ipaddress.IPv4Network(f"{address}/{prefix}", strict=False)
    kind, norm = egress_entry(str(net))
    assert kind == "network" and ipaddress.IPv4Network(norm) == net
    assert egress_entry(str(address)) == ("network", str(address))


@given(st.text(alphabet="0123456789./", min_size=1, max_size=24))
def test_digits_and_dots_are_never_a_name(text: str) -> None:
    try:
        kind, norm = egress_entry(text)
    except ConfigError:
        return
    assert kind == "network"
    assert norm == text.removesuffix("/32") and ipaddress.IPv4Network(norm)  # canonical as written


@given(st.text(max_size=40))
def test_any_text_is_an_entry_or_a_config_error(text: str) -> None:
    try:
        kind, norm = egress_entry(text)
    except ConfigError:
        return
    assert kind in ("network", "name")
    assert (norm == norm.strip() and "\n" not in norm and "/" not in norm) or kind == "network"
    assert egress_entry(norm) == (kind, norm)  # normalised entries classify the same again


# -- what the runtime writes --------------------------------------------------------------------
def _settings(tmp_path: Path) -> Settings:
    return Settings(
        net_state_dir=tmp_path / "net",
        dnsmasq_conf_dir=tmp_path / "dnsmasq.d",
        dnsmasq_pidfile=tmp_path / "run" / "dnsmasq.pid",
        lxc_path=tmp_path / "lxc",
    )


def _state(tmp_path: Path) -> NetState:
    return NetState(_settings(tmp_path))


def test_fragment_restores_internet_egress_and_the_resolver_element(tmp_path: Path) -> None:
    state = _state(tmp_path)
    net = SandboxNet(
        "sbx-0123456789", "10.99.1.7", internet=True, egress=("example.org", "192.0.2.0/24"), dns_port=20001
    )
    lines = state.fragment(net).splitlines()
    assert "add element inet sandbox internet_allowed { 10.99.1.7 }" in lines
    assert "add element inet sandbox egress_sources { 10.99.1.7 : jump egress_0123456789 }" in lines
    assert "add element inet sandbox egress_0123456789_net { 192.0.2.0/24 }" in lines
    assert "add element inet sandbox dns_resolvers { 10.99.1.7 : 20001 }" in lines
    assert not [ln for ln in lines if "dns_clients" in ln]
    # the chain is flushed before its rules are added: loading the fragment twice changes nothing
    assert lines.index("flush chain inet sandbox egress_0123456789") < lines.index(
        "add rule inet sandbox egress_0123456789 ip daddr @egress_0123456789_net accept"
    )
    # addresses only: no resolver, no DNS for the sandbox
    only_nets = state.fragment(SandboxNet("sbx-0123456789", "10.99.1.7", egress=("192.0.2.0/24",)))
    assert "dns_resolvers" not in only_nets and "internet_allowed" not in only_nets


def test_overlapping_networks_are_merged_for_nft(tmp_path: Path) -> None:
    # nft refuses overlapping intervals in one set ("conflicting intervals specified")
    entries = check_egress(
        ["192.0.2.0/24", "192.0.2.7", "192.0.2.128/25", "198.51.100.0/25", "198.51.100.128/25"]
    )
    assert entries == ("192.0.2.0/24", "192.0.2.7", "192.0.2.128/25", "198.51.100.0/25", "198.51.100.128/25")
    text = _state(tmp_path).fragment(SandboxNet("sbx-0123456789", "10.99.1.7", egress=entries))
    assert "add element inet sandbox egress_0123456789_net { 192.0.2.0/24, 198.51.100.0/24 }" in text


def test_replacing_a_list_is_one_script_that_empties_what_was_removed(tmp_path: Path) -> None:
    state = _state(tmp_path)
    old = SandboxNet("sbx-0123456789", "10.99.1.7", egress=("a.example", "192.0.2.0/24"), dns_port=20001)
    # a name removed: the resolved addresses go too; the network set is always rebuilt
    lines = state.replace_script(
        old, SandboxNet(old.sandbox_id, old.ip, egress=("b.example",), dns_port=20001)
    )
    body = lines.splitlines()
    assert "flush set inet sandbox egress_0123456789_net" in body
    assert "flush set inet sandbox egress_0123456789_dns" in body
    assert body[-1] == "add element inet sandbox dns_resolvers { 10.99.1.7 : 20001 }"
    # a name added: what is resolved stays
    added = state.replace_script(
        old, SandboxNet(old.sandbox_id, old.ip, egress=("a.example", "b.example"), dns_port=20001)
    )
    assert "flush set inet sandbox egress_0123456789_dns" not in added
    # names gone: the resolver element goes (added, then deleted: no error if it is not there)
    nets_only = state.replace_script(old, SandboxNet(old.sandbox_id, old.ip, egress=("192.0.2.0/24",)))
    assert "delete element inet sandbox dns_resolvers { 10.99.1.7 }" in nets_only
    # the list closed: chain, sets and map element go, in an order nft accepts
    closed = state.replace_script(old, SandboxNet(old.sandbox_id, old.ip)).splitlines()
    order = [
        "delete element inet sandbox egress_sources { 10.99.1.7 }",
        "delete chain inet sandbox egress_0123456789",
        "delete set inet sandbox egress_0123456789_net",
        "delete set inet sandbox egress_0123456789_dns",
    ]
    assert [closed.index(x) for x in order] == sorted(closed.index(x) for x in order)


def test_resolver_forwards_only_the_listed_names_into_the_sandbox_set(tmp_path: Path) -> None:
    resolvers = EgressResolvers(_settings(tmp_path))
    text = resolvers.config("sbx-0123456789", 20007, "egress_0123456789_dns", ["pypi.org", "1password.com"])
    lines = text.splitlines()
    assert "listen-address=10.99.0.1" in lines and "port=20007" in lines and "bind-interfaces" in lines
    assert "no-resolv" in lines and "no-hosts" in lines and "cache-size=0" in lines
    assert [ln for ln in lines if ln.startswith(("server=", "nftset=", "address=", "resolv-file"))] == [
        "server=/1password.com/10.99.0.1#53",
        "nftset=/1password.com/4#inet#sandbox#egress_0123456789_dns",
        "server=/pypi.org/10.99.0.1#53",
        "nftset=/pypi.org/4#inet#sandbox#egress_0123456789_dns",
    ]
    assert f"pid-file={tmp_path / 'run' / 'egress-sbx-0123456789.pid'}" in lines


def test_state_files_round_trip_and_empty_state_leaves_none(tmp_path: Path) -> None:
    state = _state(tmp_path)
    net = SandboxNet("sbx-0123456789", "10.99.1.7", internet=True, egress=("example.org",), dns_port=20003)
    state._write(net)
    assert state.read(net.sandbox_id) == net and state.all() == [net]
    names = sorted(p.name for p in (tmp_path / "net").iterdir())
    assert names == ["sbx-0123456789.json", "sbx-0123456789.nft"]
    assert json.loads((tmp_path / "net" / "sbx-0123456789.json").read_text())["lxc_path"] == str(
        tmp_path / "lxc"
    )
    state._write(SandboxNet("sbx-0123456789", "10.99.1.7"))
    assert list((tmp_path / "net").iterdir()) == []


def test_orphans_are_only_this_lxc_paths_sandboxes_without_a_container(tmp_path: Path) -> None:
    state = _state(tmp_path)
    other = NetState(_settings(tmp_path / "elsewhere"))
    other.dir = state.dir  # another LXC path sharing the state directory (the test suites' scratch paths)
    for sid, owner in (("sbx-aaaaaaaaaa", state), ("sbx-bbbbbbbbbb", state), ("sbx-cccccccccc", other)):
        owner._write(SandboxNet(sid, "10.99.1.9", internet=True))
    (tmp_path / "lxc" / "sbx-aaaaaaaaaa").mkdir(parents=True)  # still has its container
    assert state.orphans(set()) == ["sbx-bbbbbbbbbb"]
    assert state.orphans({"sbx-bbbbbbbbbb"}) == []  # a create in progress
    assert other.orphans(set()) == ["sbx-cccccccccc"]


class _FakeHost:
    """Stands in for nft and dnsmasq: records transactions, fails the ones it is told to."""

    def __init__(self, state: NetState, monkeypatch: pytest.MonkeyPatch) -> None:
        self.scripts: list[str] = []
        self.fail_nft = False
        self.started: dict[str, int] = {}
        self.busy_ports: set[int] = set()

        def nft_script(script: str) -> subprocess.CompletedProcess[str]:
            self.scripts.append(script)
            return subprocess.CompletedProcess(["nft"], 1 if self.fail_nft else 0, "", "Error: injected")

        def start(sid: str, port: int) -> None:
            if port in self.busy_ports:
                from sandbox_rt.backends.lxc.egress_dns import PortBusy

                raise PortBusy("busy", step="network")
            self.started[sid] = port

        monkeypatch.setattr(state, "_nft_script", nft_script)
        monkeypatch.setattr(state.resolvers, "start", start)
        monkeypatch.setattr(state.resolvers, "stop", lambda sid: self.started.pop(sid, None))
        monkeypatch.setattr(state.resolvers, "running", lambda sid: sid in self.started)
        monkeypatch.setattr("sandbox_rt.backends.lxc.egress_dns.bound_ports", lambda *a, **k: set())


def test_apply_is_all_or_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = _state(tmp_path)
    host = _FakeHost(state, monkeypatch)
    sid = "sbx-0123456789"
    first = state.apply(SandboxNet(sid, "10.99.1.7", egress=("a.example", "192.0.2.0/24")))
    assert first.dns_port == 20000 and host.started == {sid: 20000}
    conf = state.resolvers.read(sid)
    assert conf is not None and "server=/a.example/" in conf
    files = {p.name: p.read_text() for p in state.dir.iterdir() if not p.name.startswith(".")}

    host.fail_nft = True  # nft refuses the next transaction
    with pytest.raises(BackendError, match="live rules are unchanged"):
        state.apply(SandboxNet(sid, "10.99.1.7", egress=("b.example",)))
    assert {p.name: p.read_text() for p in state.dir.iterdir() if not p.name.startswith(".")} == files
    assert state.read(sid) == first and host.started == {sid: 20000}  # the old resolver again

    host.fail_nft = False
    second = state.apply(SandboxNet(sid, "10.99.1.7", egress=("b.example",)))
    assert second.dns_port == 20000  # a sandbox keeps its port
    third = state.apply(SandboxNet(sid, "10.99.1.7", egress=("192.0.2.0/24",)))
    assert third.dns_port is None and host.started == {} and state.resolvers.read(sid) is None


def test_a_new_sandbox_whose_change_fails_leaves_no_files_and_no_resolver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = _state(tmp_path)
    host = _FakeHost(state, monkeypatch)
    host.fail_nft = True
    with pytest.raises(BackendError):
        state.apply(SandboxNet("sbx-0123456789", "10.99.1.7", egress=("a.example",)))
    assert [p.name for p in state.dir.iterdir() if not p.name.startswith(".")] == []
    assert host.started == {}


def test_ports_are_distinct_and_a_busy_one_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = _state(tmp_path)
    host = _FakeHost(state, monkeypatch)
    host.busy_ports = {20001}  # taken by someone else between the check and the bind
    ports = [
        state.apply(SandboxNet(f"sbx-00000000{i:02d}", f"10.99.1.{i}", egress=("a.example",))).dns_port
        for i in range(3)
    ]
    assert ports == [20000, 20002, 20003]
    assert state.remove("sbx-0000000000", None) and "sbx-0000000000" not in host.started
    assert state.apply(SandboxNet("sbx-0000000009", "10.99.1.9", egress=("a.example",))).dns_port == 20000


@pytest.mark.parametrize(("low", "high"), [(100, 2000), (21000, 20000), (60000, 70000)])
def test_the_resolver_port_range_is_checked(low: int, high: int) -> None:
    with pytest.raises(ConfigError, match=r"egress_dns_port_min\.\.max"):
        Settings(egress_dns_port_min=low, egress_dns_port_max=high)


def test_an_exhausted_port_range_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = dataclasses.replace(_settings(tmp_path), egress_dns_port_min=20000, egress_dns_port_max=20001)
    monkeypatch.setattr("sandbox_rt.backends.lxc.egress_dns.bound_ports", lambda *a, **k: {20001})
    with pytest.raises(BackendError, match=r"no free port .* 20000-20001"):
        EgressResolvers(settings).pick_port({20000})
