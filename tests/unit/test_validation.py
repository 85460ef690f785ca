import math
from collections.abc import Callable

import pytest

from sandbox_rt.errors import ConfigError
from sandbox_rt.validation import (
    SANDBOX_ID,
    check_egress,
    check_env,
    check_hostname,
    check_remote_path,
    check_sandbox_id,
    check_snapshot_name,
    check_timeout,
    make_spec,
)


def test_defaults_are_valid() -> None:
    spec = make_spec(host_cpus=2)
    assert spec.cpus == 1 and spec.memory_mb == 1024 and spec.internet is False


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"cpus": 0}, "cpus=0"),
        ({"cpus": -1}, "cpus=-1"),
        ({"cpus": 3}, "cpus=3"),
        ({"cpus": math.nan}, "cpus=nan"),
        ({"cpus": "two"}, "cpus='two'"),
        ({"memory_mb": 63}, "memory_mb=63"),
        ({"memory_mb": "lots"}, "memory_mb='lots'"),
        ({"memory_mb": 100.5}, "memory_mb=100.5"),
        ({"memory_mb": True}, "memory_mb=True"),
        ({"disk_gb": 0}, "disk_gb=0"),
        ({"disk_gb": 10**9}, "disk_gb=1000000000"),
        ({"pids_max": 1}, "pids_max=1"),
        ({"internet": "yes"}, "internet='yes'"),
        ({"ttl_s": -5}, "ttl_s=-5"),
        ({"hostname": "-bad"}, "hostname='-bad'"),
        ({"hostname": "a" * 64}, "hostname="),
        ({"hostname": "under_score"}, "hostname='under_score'"),
        ({"labels": {"k k": "v"}}, "label key 'k k'"),
        ({"labels": {"k": 1}}, "label k=1"),
    ],
)
def test_bad_create_arguments_name_the_value(kwargs: dict[str, object], names: str) -> None:
    with pytest.raises(ConfigError) as err:
        make_spec(host_cpus=2, **kwargs)  # type: ignore[arg-type]
    assert names in str(err.value)


def test_hostname_is_lowercased_rfc1123() -> None:
    assert check_hostname("Agent-7") == "agent-7"
    with pytest.raises(ConfigError):
        check_hostname("a.b")  # one label only: it is also the container's name


def test_paths_must_be_absolute_without_nul() -> None:
    assert check_remote_path("/tmp/x") == "/tmp/x"
    for bad in ("relative/x", "", "/tmp/\x00x"):
        with pytest.raises(ConfigError):
            check_remote_path(bad)


def test_timeouts_and_ids_and_env() -> None:
    assert check_timeout(None) is None and check_timeout(2) == 2.0
    for bad in (0, -1, "3"):
        with pytest.raises(ConfigError):
            check_timeout(bad)  # type: ignore[arg-type]
    assert check_sandbox_id("sbx-0123456789") == "sbx-0123456789"
    for bad in ("sbx-1", "../etc", "sbx-0123456789x"):
        with pytest.raises(ConfigError):
            check_sandbox_id(bad)
    assert check_env({"A_1": "x y"}) == {"A_1": "x y"}
    for bad_env in ({"1A": "x"}, {"A": "x\x00"}, {"A=B": "x"}):
        with pytest.raises(ConfigError):
            check_env(bad_env)


@pytest.mark.parametrize(
    ("check", "good"),
    [
        (check_hostname, "agent-7"),
        (check_sandbox_id, "sbx-0123456789"),
        (check_snapshot_name, "base_1"),
        (lambda v: check_env({v: "x"}), "A_1"),
        (lambda v: make_spec(host_cpus=2, labels={v: "x"}), "team/a.b"),
        (lambda v: check_egress([v]), "example.org"),
        (lambda v: check_egress([v]), "192.0.2.0/24"),
    ],
)
def test_a_trailing_newline_is_refused_everywhere(check: Callable[[str], object], good: str) -> None:
    check(good)  # the value itself is fine
    for bad in (good + "\n", good + "\r\n", "\n" + good, good + "\nx"):
        with pytest.raises(ConfigError):
            check(bad)


def test_the_exported_id_pattern_is_anchored_for_every_use() -> None:
    # other modules use SANDBOX_ID.match(): it must not accept a trailing newline either
    assert SANDBOX_ID.match("sbx-0123456789") and not SANDBOX_ID.match("sbx-0123456789\n")
    assert not SANDBOX_ID.search("x/sbx-0123456789")
