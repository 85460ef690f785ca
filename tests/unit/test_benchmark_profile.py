"""The benchmarks time runtime steps by wrapping a method where it is defined (benchmarks/profile.py: the
create's steps; benchmarks/throughput.py: the host-wide locks) and skip one that is no longer there: a
method that moves to another class or module (a split of its module) must take its target along, or
the step silently drops out. The slow tier sees it late (a negative "ssh: wait for sshd to listen");
this sees it at once."""

from __future__ import annotations

from benchmarks import profile, throughput


def test_every_timed_step_is_defined_where_the_benchmarks_wrap_it() -> None:
    targets = [(owner, attr) for owner, attr, _label in (*profile.TARGETS, *throughput.LOCKS)]
    missing = [
        f"{getattr(owner, '__name__', owner)}.{attr}" for owner, attr in targets if attr not in vars(owner)
    ]
    assert missing == []
    assert len(targets) >= 10
