"""Egress allow-lists: argument checks and what the runtime writes for nft and dnsmasq (no host)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_rt import ConfigError, Settings
from sandbox_rt.netstate import NetState, SandboxNet
from sandbox_rt.validation import check_egress, make_spec, split_egress


def test_entries_are_normalised() -> None:
    got = check_egress(["Example.ORG.", "*.api.example.org", "192.0.2.0/24", "198.51.100.7", "example.org"])
    assert got == ("example.org", "api.example.org", "192.0.2.0/24", "198.51.100.7")
    assert split_egress(got) == (["192.0.2.0/24", "198.51.100.7"], ["example.org", "api.example.org"])
    assert check_egress(["198.51.100.7/32"]) == ("198.51.100.7",)
    assert check_egress(None) == () and check_egress([]) == ()
    assert make_spec(egress=["example.org"]).egress == ("example.org",)


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
        (["evil.org/4#inet#sandbox#internet_allowed"], "domain name"),
        (["x.org\nnftset=/y/"], "domain name"),
        (["a.org\x00"], "non-empty"),
        ([f"h{i}.example" for i in range(65)], "at most 64"),
    ],
)
def test_bad_entries_are_config_errors(egress: object, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        check_egress(egress)  # type: ignore[arg-type]


def _state(tmp_path: Path) -> NetState:
    return NetState(Settings(net_state_dir=tmp_path / "net", dnsmasq_conf_dir=tmp_path / "dnsmasq.d"))


def test_fragment_restores_internet_and_egress(tmp_path: Path) -> None:
    state = _state(tmp_path)
    net = SandboxNet("sbx-0123456789", "10.99.1.7", internet=True, egress=("example.org", "192.0.2.0/24"))
    lines = state.fragment(net).splitlines()
    assert "add element inet sandbox internet_allowed { 10.99.1.7 }" in lines
    assert "add element inet sandbox egress_sources { 10.99.1.7 : jump egress_0123456789 }" in lines
    assert "add element inet sandbox egress_0123456789_net { 192.0.2.0/24 }" in lines
    assert "add element inet sandbox dns_clients { 10.99.1.7 }" in lines
    # the chain is flushed before its rules are added: loading the fragment twice changes nothing
    assert lines.index("flush chain inet sandbox egress_0123456789") < lines.index(
        "add rule inet sandbox egress_0123456789 ip daddr @egress_0123456789_net accept"
    )
    # addresses only: no DNS for the sandbox
    only_nets = state.fragment(SandboxNet("sbx-0123456789", "10.99.1.7", egress=("192.0.2.0/24",)))
    assert "dns_clients" not in only_nets and "internet_allowed" not in only_nets


def test_dnsmasq_gets_one_line_per_domain_naming_every_set(tmp_path: Path) -> None:
    state = _state(tmp_path)
    text = state.dnsmasq_config(
        [
            SandboxNet("sbx-aaaaaaaaaa", "10.99.1.1", egress=("example.org", "192.0.2.1")),
            SandboxNet("sbx-bbbbbbbbbb", "10.99.1.2", egress=("example.org", "pypi.org")),
            SandboxNet("sbx-cccccccccc", "10.99.1.3", internet=True),
        ]
    )
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert lines == [
        "nftset=/example.org/4#inet#sandbox#egress_aaaaaaaaaa_dns,4#inet#sandbox#egress_bbbbbbbbbb_dns",
        "nftset=/pypi.org/4#inet#sandbox#egress_bbbbbbbbbb_dns",
    ]


def test_state_files_round_trip_and_empty_state_leaves_none(tmp_path: Path) -> None:
    state = _state(tmp_path)
    net = SandboxNet("sbx-0123456789", "10.99.1.7", internet=True, egress=("example.org",))
    state._write(net)
    assert state.read(net.sandbox_id) == net and state.all() == [net]
    names = sorted(p.name for p in (tmp_path / "net").iterdir())
    assert names == ["sbx-0123456789.json", "sbx-0123456789.nft"]
    state._write(SandboxNet("sbx-0123456789", "10.99.1.7"))
    assert list((tmp_path / "net").iterdir()) == []
