"""The exec wrapper's markers are found however the stream is cut, and never leak into output."""

import pytest

from sandbox_rt.models import OutputChunk
from sandbox_rt.ssh.markers import Demux as _Demux
from sandbox_rt.ssh.markers import Markers as _Markers


def _streams(m: _Markers, out: bytes, err: bytes, rc: int, bg: bytes = b"") -> tuple[bytes, bytes]:
    tok = m.token.encode()
    stdout = out + b"\x1e" + tok + b"E%d\x1e" % rc + bg
    stderr = b"\x1e" + tok + b"P4242\x1e" + err + b"\x1e" + tok + b"E\x1e" + bg
    return stdout, stderr


@pytest.mark.parametrize("cut", [1, 2, 3, 7, 64, 10_000])
def test_markers_split_anywhere(cut: int) -> None:
    m = _Markers()
    chunks: list[OutputChunk] = []
    d = _Demux(m, chunks.append)
    out = b"hello\x1eworld\n" * 5
    stdout, stderr = _streams(m, out, b"oops\n", 3, bg=b"late background output")
    for i in range(0, max(len(stdout), len(stderr)), cut):
        d.feed("stderr", stderr[i : i + cut])
        d.feed("stdout", stdout[i : i + cut])
    assert d.done and d.exit_code == 3 and d.pgid == 4242
    assert bytes(d.out) == out and bytes(d.err) == b"oops\n"
    assert b"".join(c.data for c in chunks if c.stream == "stdout") == out


def test_other_tokens_are_plain_output() -> None:
    m = _Markers()
    other = _Markers()
    d = _Demux(m, None)
    fake_out, fake_err = _streams(other, b"x", b"y", 9)
    real_out, real_err = _streams(m, b"", b"", 0)
    d.feed("stderr", real_err[: real_err.index(b"\x1e", 1) + 1])  # pgid marker first
    d.feed("stdout", fake_out + real_out)
    d.feed("stderr", fake_err + real_err[real_err.index(b"\x1e", 1) + 1 :])
    assert d.exit_code == 0 and bytes(d.out) == fake_out and bytes(d.err) == fake_err


def test_wrapper_quotes_cwd_env_and_command() -> None:
    m = _Markers()
    text = m.wrap("echo 'a b'; exit 3", "/tmp/with space", {"K": "v'1"})
    assert "setsid -w" in text and m.token in text
    assert "'/tmp/with space'" in text and "'K=v'\"'\"'1'" in text


def test_pending_output_stays_bounded() -> None:
    m = _Markers()
    d = _Demux(m, None)
    d.feed("stderr", b"\x1e" + m.token.encode() + b"P1\x1e")
    d.feed("stdout", b"\x1e")  # an early separator must not make everything after it pending
    for _ in range(200):
        d.feed("stdout", b"x" * 5000)
        assert len(d.pending_out) <= 64  # so each feed scans a bounded window: linear in output
    assert len(d.out) == 200 * 5000 + 1
