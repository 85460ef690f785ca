"""The create profile (benchmarks/profile.py) times each step by wrapping a method where it is defined,
and skips one that is no longer there: a method that moves to another class or module (a split of its
module) must take its target along, or the step silently drops out of the profile. The slow tier sees it
only as a negative "ssh: wait for sshd to listen"; this sees it at once."""

from __future__ import annotations

from benchmarks import profile


def test_every_timed_step_is_defined_where_the_profile_wraps_it() -> None:
    missing = [
        f"{getattr(owner, '__name__', owner)}.{attr}"
        for owner, attr, _ in profile.TARGETS
        if attr not in vars(owner)
    ]
    assert missing == []
