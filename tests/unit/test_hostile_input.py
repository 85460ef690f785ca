"""Host-side checks on what a sandbox sends back, without a sandbox (fast twins of test_hostile.py)."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandbox_rt.download import download_tree
from sandbox_rt.errors import FileOperationError
from sandbox_rt.models import OutputChunk
from sandbox_rt.ssh.files import check_entry_name
from sandbox_rt.ssh.markers import Demux, Markers


# -- exec output -----------------------------------------------------------------------------------
def _end(m: Markers, rc: int) -> tuple[bytes, bytes]:
    tok = m.token.encode()
    return b"\x1e" + tok + b"E%d\x1e" % rc, b"\x1e" + tok + b"E\x1e"


def test_output_past_max_output_is_counted_not_kept_and_the_sink_sees_all() -> None:
    m = Markers()
    seen: list[OutputChunk] = []
    d = Demux(m, seen.append, max_output=10)
    d.feed("stderr", b"\x1e" + m.token.encode() + b"P77\x1e")
    for _ in range(5):
        d.feed("stdout", b"0123456")
        d.feed("stderr", b"abc")
    end_out, end_err = _end(m, 0)
    d.feed("stdout", end_out)
    d.feed("stderr", end_err)
    assert d.done and bytes(d.out) == b"0123456012" and d.dropped_out == 25
    assert bytes(d.err) == b"abcabcabca" and d.dropped_err == 5 and d.truncated
    assert sum(len(c.data) for c in seen) == 35 + 15


def test_forged_markers_with_absurd_numbers_are_plain_output() -> None:
    m = Markers()
    d = Demux(m, None)
    tok = m.token.encode()
    d.feed("stderr", b"\x1e" + tok + b"P" + b"9" * 5000 + b"\x1e")
    d.feed("stdout", b"\x1e" + tok + b"E" + b"9" * 5000 + b"\x1e" + b"\x1e" + tok + b"E999\x1e")
    assert d.pgid is None and d.exit_code is None
    d.feed("stdout", b"\x1e" + tok + b"E255\x1e")
    assert d.exit_code == 255


def test_stderr_without_a_process_group_marker_is_held_only_so_long() -> None:
    d = Demux(Markers(), None, max_output=1 << 20)
    for _ in range(100):
        d.feed("stderr", b"e" * 4096)
    assert len(d.pending_err) <= 64 and len(d.err) >= 400_000 - 64


# -- names -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name", ["", ".", "..", "a/b", "../x", "/etc/passwd", "a\x00b", "x" * 256, "é" * 128, 5, None]
)
def test_names_that_are_not_one_path_component_are_refused(name: object) -> None:
    with pytest.raises(FileOperationError) as caught:
        check_entry_name(name, "/d")
    assert caught.value.errno in (errno.EINVAL, errno.ENAMETOOLONG)


@given(
    st.text(min_size=1, max_size=60).filter(
        lambda s: "/" not in s and "\x00" not in s and s not in (".", "..")
    )
)
def test_every_single_component_is_accepted(name: str) -> None:
    try:
        name.encode()
    except UnicodeEncodeError:
        return  # lone surrogates cannot come from a UTF-8 listing
    assert check_entry_name(name, "/d") == name


# -- downloads, against an in-memory sandbox ----------------------------------------------------
@dataclass
class Entry:
    filename: str
    st_mode: int


class FakeTree:
    """A sandbox file tree: ``{dir: [(name, mode)]}``, every file's content is its path."""

    def __init__(self, dirs: dict[str, list[tuple[str, int]]]) -> None:
        self.dirs = dirs

    def listdir(self, path: str, max_entries: int) -> Sequence[Entry]:
        entries = [Entry(n, m) for n, m in self.dirs[path]]
        if len(entries) > max_entries:
            raise FileOperationError(errno.E2BIG, "list: too many", path)
        return entries

    def get_stream(self, path: str, dst: IO[bytes], max_bytes: int) -> int:
        data = path.encode()
        if len(data) > max_bytes:
            raise FileOperationError(errno.EFBIG, "read: too big", path)
        dst.write(data)
        return len(data)


REG, DIR = 0o100644, 0o040755


def test_a_tree_is_copied_with_files_and_directories(tmp_path: Path) -> None:
    tree = FakeTree({"/t": [("a", REG), ("s", DIR), ("l", 0o120777)], "/t/s": [("b", 0o100755)]})
    n = download_tree(tree, "/t", tmp_path / "d", 1 << 20)
    assert n == len("/t/a") + len("/t/s/b")
    assert (tmp_path / "d/a").read_bytes() == b"/t/a" and not (tmp_path / "d/l").exists()
    assert os.stat(tmp_path / "d/s/b").st_mode & 0o777 == 0o755
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["a", "s"]  # no temporary files left


def test_the_byte_budget_covers_the_whole_tree(tmp_path: Path) -> None:
    tree = FakeTree({"/t": [(f"f{i}", REG) for i in range(10)]})
    with pytest.raises(FileOperationError) as caught:
        download_tree(tree, "/t", tmp_path / "d", 5 * len("/t/f0"))
    assert caught.value.errno == errno.EFBIG
    assert len(list((tmp_path / "d").iterdir())) == 5


def test_a_local_symlink_in_the_way_is_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "d").mkdir()
    (tmp_path / "d/s").symlink_to(outside)
    tree = FakeTree({"/t": [("s", DIR)], "/t/s": [("x", REG)]})
    with pytest.raises(FileOperationError) as caught:
        download_tree(tree, "/t", tmp_path / "d", 1 << 20)
    assert caught.value.errno in (errno.ELOOP, errno.ENOTDIR)
    assert list(outside.iterdir()) == []


def test_a_directory_where_a_file_goes_ends_the_download_without_leftovers(tmp_path: Path) -> None:
    (tmp_path / "d/a").mkdir(parents=True)
    tree = FakeTree({"/t": [("a", REG)]})
    with pytest.raises(FileOperationError):
        download_tree(tree, "/t", tmp_path / "d", 1 << 20)
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["a"]


def test_read_exchange_refuses_a_size_line_that_is_not_a_number() -> None:
    from sandbox_rt.ssh.files import _parse_size

    assert _parse_size(b"123", "/p") == 123
    assert _parse_size(b"9" * 40, "/p") > 1 << 63
    for bad in (b"", b"-1", b"12abc", b" 1", "١٢".encode()):
        with pytest.raises(FileOperationError):
            _parse_size(bad, "/p")


def test_sftp_replies_larger_than_the_bound_are_refused_before_they_are_read() -> None:
    import paramiko

    from sandbox_rt.limits import SFTP_MAX_PACKET
    from sandbox_rt.ssh.wire import BoundedSFTPClient

    client = object.__new__(BoundedSFTPClient)  # no channel: only the packet reader is exercised
    asked: list[int] = []
    wire = [(SFTP_MAX_PACKET + 1).to_bytes(4, "big")]

    def read_all(n: int) -> bytes:
        asked.append(n)
        return wire.pop(0) if wire else b"\x65" + b"\0" * (n - 1)

    client._read_all = read_all  # type: ignore[attr-defined]
    with pytest.raises(paramiko.SFTPError, match="refused"):
        client._read_packet()
    assert asked == [4]  # the 4 MiB + 1 body was never read
    wire[:] = [(5).to_bytes(4, "big")]
    assert client._read_packet() == (0x65, b"\0" * 4)
