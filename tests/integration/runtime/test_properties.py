"""Property-based checks on a real sandbox: quoting is exact, bad input is always a SandboxError."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sandbox_rt

# any text without NUL (argv cannot carry NUL) — quotes, $, `, \, newlines, unicode, ...
words = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def shared(lxc_manager: sandbox_rt.Manager):  # type: ignore[no-untyped-def]
    sb = lxc_manager.create(memory_mb=256, labels={"test-session": "properties"})
    yield sb
    sb.destroy()


@SETTINGS
@given(argv=st.lists(words, min_size=1, max_size=5))
def test_argv_reaches_the_program_exactly(shared: sandbox_rt.Sandbox, argv: list[str]) -> None:
    r = shared.exec(["printf", "%s\\0", *argv])
    assert r.exit_code == 0
    assert r.stdout.split(b"\x00")[:-1] == [a.encode() for a in argv]


@SETTINGS
@given(text=words)
def test_env_values_and_stdin_are_exact(shared: sandbox_rt.Sandbox, text: str) -> None:
    r = shared.exec('printf %s "$V"', env={"V": text})
    assert r.stdout == text.encode()
    assert shared.exec("cat", stdin=text.encode()).stdout == text.encode()


@SETTINGS
@given(name=st.text(max_size=30))
def test_file_paths_never_escape_quoting(shared: sandbox_rt.Sandbox, name: str) -> None:
    path = "/tmp/p/" + name
    try:
        shared.write_file(path, b"data")
    except sandbox_rt.SandboxError:
        return  # odd names (NUL, '/' tricks, too long, ...) give a typed error, nothing else
    assert shared.read_file(path) == b"data"


@SETTINGS
@given(
    cpus=st.one_of(st.floats(allow_nan=True), st.integers(), st.text(max_size=3)),
    memory=st.one_of(st.integers(-(2**40), 2**40), st.floats(), st.none()),
    hostname=st.one_of(st.none(), st.text(max_size=70)),
    egress=st.one_of(
        st.none(),
        st.text(max_size=12),
        st.lists(st.one_of(st.text(max_size=24), st.ip_addresses(v=4).map(str), st.integers()), max_size=3),
    ),
)
def test_create_arguments_fail_typed_or_work(
    lxc_manager: sandbox_rt.Manager, cpus: object, memory: object, hostname: str | None, egress: object
) -> None:
    try:
        sb = lxc_manager.create(
            cpus=cpus,
            memory_mb=memory,
            hostname=hostname,  # type: ignore[arg-type]
            egress=egress,  # type: ignore[arg-type]
            labels={"test-session": "properties"},
        )
    except sandbox_rt.SandboxError:
        return
    try:
        assert sb.exec("true").exit_code == 0
    finally:
        sb.destroy()


def test_large_and_non_utf8_output(shared: sandbox_rt.Sandbox) -> None:
    r = shared.exec("head -c 10000000 /dev/zero | tr '\\0' 'x'; printf '\\xff\\xfe'", timeout=60)
    assert len(r.stdout) == 10_000_002 and r.stdout.endswith(b"\xff\xfe")
    assert r.text.endswith("\ufffd\ufffd")
