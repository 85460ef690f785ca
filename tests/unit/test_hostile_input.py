"""Host-side checks on what a sandbox sends back, without a sandbox (fast twins of test_hostile.py)."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import paramiko
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lying_sftp import World, lying_sftp, os_stat
from paramiko.sftp_attr import SFTPAttributes

from sandbox_rt.download import download_tree
from sandbox_rt.errors import ConnectionLost, FileOperationError
from sandbox_rt.files import Files
from sandbox_rt.models import OutputChunk
from sandbox_rt.output_limits import SFTP_MAX_PACKET
from sandbox_rt.ssh import SSHExecutor
from sandbox_rt.ssh.files import check_entry_name, read_script
from sandbox_rt.ssh.markers import Demux, Markers
from sandbox_rt.ssh.mounts import MOUNTS_MAX, mount_of, parse_mountinfo
from sandbox_rt.ssh.wire import STATUS_TEXT_MAX


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

    from sandbox_rt.output_limits import SFTP_MAX_PACKET
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


# -- SFTP failures: the cause found on the host side, against an in-process SFTP server ------------
# OpenSSH's sftp-server answers most errors with a bare FAILURE, EINVAL with "Bad message" and
# ENOTDIR with "no such file"; lying_sftp.World answers the same way and keeps the errno it hid.
P, Q = "/t/p", "/t/q"
CAUSES = {
    errno.EIO,
    errno.ENOENT,
    errno.EISDIR,
    errno.ENOTDIR,
    errno.ENOTEMPTY,
    errno.EEXIST,
    errno.EINVAL,
    errno.ENAMETOOLONG,
}
LONG = "/t/" + "n" * 256


@pytest.fixture
def world() -> World:
    return World()


@pytest.fixture
def sftp(world: World) -> Iterator[SSHExecutor]:
    with lying_sftp(world) as executor:
        yield executor


def _files(executor: SSHExecutor) -> Files:
    return Files(cast(Any, None), executor, lambda: None)


def _failure(action: Callable[[], object]) -> FileOperationError:
    with pytest.raises(FileOperationError) as caught:
        action()
    return caught.value


CASES: list[tuple[str, tuple[str, ...], str, Callable[[SSHExecutor], object], int]] = [
    ("write onto a directory", ("/t/p/",), "open", lambda x: x.write_bytes(P, b"x"), errno.EISDIR),
    ("write below a file", ("/t/p",), "open", lambda x: x.write_bytes(P + "/f", b"x"), errno.ENOTDIR),
    ("remove a full directory", ("/t/p/f",), "rmdir", lambda x: _files(x).remove(P), errno.ENOTEMPTY),
    ("rmdir a file", ("/t/p",), "rmdir", lambda x: x.rmdir(P), errno.ENOTDIR),
    ("unlink a directory", ("/t/p/",), "remove", lambda x: x.remove(P), errno.EISDIR),
    ("rename into itself", ("/t/p/sub/",), "rename", lambda x: x.rename(P, P + "/sub/x"), errno.EINVAL),
    (
        "rename onto a full directory",
        ("/t/p/", "/t/q/f"),
        "rename",
        lambda x: x.rename(P, Q),
        errno.ENOTEMPTY,
    ),
    ("rename a directory onto a file", ("/t/p/", "/t/q"), "rename", lambda x: x.rename(P, Q), errno.ENOTDIR),
    ("rename a file onto a directory", ("/t/p", "/t/q/"), "rename", lambda x: x.rename(P, Q), errno.EISDIR),
    ("rename below a file", ("/t/p", "/t/q"), "rename", lambda x: x.rename(P, Q + "/x"), errno.ENOTDIR),
    ("mkdir over a file", ("/t/p",), "mkdir", lambda x: x.mkdir(P), errno.EEXIST),
    (
        "mkdir below a file",
        ("/t/p",),
        "mkdir",
        lambda x: _files(x).mkdir(P + "/d", parents=False),
        errno.ENOTDIR,
    ),
    ("write a name too long", ("/t/",), "open", lambda x: x.write_bytes(LONG, b"x"), errno.ENAMETOOLONG),
    ("rename to a name too long", ("/t/p",), "rename", lambda x: x.rename(P, LONG), errno.ENAMETOOLONG),
    ("rename what is not there", ("/t/",), "rename", lambda x: x.rename(P, Q), errno.ENOENT),
    ("write below nothing", ("/t/",), "open", lambda x: x.write_bytes(P + "/f", b"x"), errno.ENOENT),
]


@pytest.mark.parametrize(
    ("paths", "op", "action", "cause"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_failure_the_server_does_not_explain_is_named_by_what_is_there(
    world: World,
    sftp: SSHExecutor,
    paths: tuple[str, ...],
    op: str,
    action: Callable[[SSHExecutor], object],
    cause: int,
) -> None:
    world.add(*paths)
    err = _failure(lambda: action(sftp))
    assert world.errors[-1] == (op, cause)  # what the server knew and did not say
    assert err.errno == cause, err
    assert str(err.strerror).startswith(("write: ", "rmdir: ", "remove: ", "rename: ", "mkdir: "))
    assert err.filename in (P, P + "/f", P + "/d", LONG)


def test_the_way_to_a_success_asks_nothing_more(world: World, sftp: SSHExecutor) -> None:
    world.add("/t/q/")
    sftp.write_bytes(P, b"data")
    sftp.rename(P, Q + "/p")
    sftp.mkdir(P)
    sftp.rmdir(P)
    assert world.requests == [("open", P), ("rename", P), ("mkdir", P), ("rmdir", P)]


def test_a_failure_nothing_explains_stays_eio(world: World, sftp: SSHExecutor) -> None:
    world.add("/t/p/", "/t/q")
    world.fail = {op: paramiko.sftp.SFTP_FAILURE for op in ("open", "rmdir", "rename", "remove")}
    for action, op in [
        (lambda: sftp.write_bytes(Q, b"x"), "write"),  # a regular file: the disk may be full
        (lambda: sftp.rmdir(P), "rmdir"),  # an empty directory: busy, read-only...
        (lambda: sftp.rename(Q, "/t/r"), "rename"),
        (lambda: sftp.remove(Q), "remove"),
    ]:
        err = _failure(action)
        assert (err.errno, err.strerror) == (errno.EIO, f"{op}: Failure")


MOUNT_CASES: list[tuple[str, Callable[[SSHExecutor], object], str, int]] = [
    ("write on a read-only mount", lambda x: x.write_bytes("/ro/f", b"x"), "open", errno.EROFS),
    ("mkdir on a read-only mount", lambda x: x.mkdir("/ro/d"), "mkdir", errno.EROFS),
    ("remove on a read-only mount", lambda x: x.remove("/ro/seed"), "remove", errno.EROFS),
    ("rename on a read-only mount", lambda x: x.rename("/ro/seed", "/ro/s2"), "rename", errno.EROFS),
    ("rename from one mount to another", lambda x: x.rename("/vol/f", "/t/f"), "rename", errno.EXDEV),
    ("rename into a mount", lambda x: x.rename(Q, "/vol/q"), "rename", errno.EXDEV),
    ("rename a mount point", lambda x: x.rename("/vol", "/t/v"), "rename", errno.EBUSY),
    ("rename onto a mount point", lambda x: x.rename("/t/e/", "/vol"), "rename", errno.EBUSY),
    ("rmdir a mount point", lambda x: x.rmdir("/empty"), "rmdir", errno.EBUSY),
    ("write a path ending in /", lambda x: x.write_bytes(Q + "/", b"x"), "open", errno.EISDIR),
]


@pytest.mark.parametrize(
    ("action", "op", "cause"), [c[1:] for c in MOUNT_CASES], ids=[c[0] for c in MOUNT_CASES]
)
def test_a_failure_is_named_by_the_mounts_involved(
    world: World, sftp: SSHExecutor, action: Callable[[SSHExecutor], object], op: str, cause: int
) -> None:
    """Found by fuzzing (issue 35): OpenSSH says FAILURE for EXDEV, EBUSY, EROFS and for a creat of
    "name/" (EISDIR); nothing explained them, so the HTTP API answered 500 (files/rename of a name on
    another mount, a write under a read_only volume or /sys)."""
    world.add("/t/q", "/t/e/", "/ro/seed", "/vol/f", "/empty/")
    world.mounts.update({"/ro": True, "/vol": False, "/empty": False})
    err = _failure(lambda: action(sftp))
    assert world.errors[-1] == (op, cause)  # what the server knew and did not say
    assert err.errno == cause, err


def test_the_mounts_are_read_only_after_a_failure(world: World, sftp: SSHExecutor) -> None:
    world.add("/t/q", "/vol/")
    world.mounts["/vol"] = False
    sftp.rename(Q, "/t/r")
    assert ("mountinfo", "/proc/self/mountinfo") not in world.requests
    assert _failure(lambda: sftp.rename("/t/r", "/vol/r")).errno == errno.EXDEV
    assert ("mountinfo", "/proc/self/mountinfo") in world.requests


def test_a_link_whose_target_is_not_utf8_has_no_target(world: World, sftp: SSHExecutor) -> None:
    """Found by fuzzing (issue 35): paramiko gives such a target as bytes; the stat route answered 500."""
    world.links[P] = b"/t/\xff\xfe"
    assert sftp.readlink(P) is None


def test_a_read_of_a_path_linux_refuses_is_enametoolong() -> None:
    """Found by fuzzing (issue 35): bash printed the whole path back, the reason was cut off: 500."""
    for path in ("/" + "z" * 5000, LONG):
        with pytest.raises(FileOperationError) as caught:
            read_script(path)
        assert caught.value.errno == errno.ENAMETOOLONG


def test_status_texts_are_cut_and_bad_utf8_is_no_error(world: World, sftp: SSHExecutor) -> None:
    world.add("/t/q")
    world.fail = {"open": paramiko.sftp.SFTP_FAILURE}
    world.text = b"\xff\xfe" + b"x" * (1 << 20)
    err = _failure(lambda: sftp.write_bytes(Q, b"x"))
    assert err.errno == errno.EIO and len(str(err)) < STATUS_TEXT_MAX + 100
    assert str(err.strerror).startswith("write: \ufffd\ufffdxxx")


def test_a_stat_that_says_directory_for_what_it_refused_only_picks_the_errno(
    world: World, sftp: SSHExecutor
) -> None:
    world.fail = {"open": paramiko.sftp.SFTP_FAILURE, "rmdir": paramiko.sftp.SFTP_FAILURE}
    world.lies = {P: SFTPAttributes.from_stat(os_stat(DIR))}
    world.listing = {P: [".", "..", "ghost"]}
    assert _failure(lambda: sftp.write_bytes(P, b"x")).errno == errno.EISDIR  # nothing is at P
    assert _failure(lambda: sftp.rmdir(P)).errno == errno.ENOTEMPTY
    world.listing = {P: [".", ".."]}
    assert _failure(lambda: sftp.rmdir(P)).errno == errno.EIO


def _with_attrs(mode: int | None, size: int | None) -> SFTPAttributes:
    attrs = SFTPAttributes()
    attrs.st_mode, attrs.st_size = mode, size
    return attrs


LIES = st.one_of(
    st.sampled_from([paramiko.sftp.SFTP_FAILURE, paramiko.sftp.SFTP_NO_SUCH_FILE, 99]),
    st.builds(
        _with_attrs,
        st.none() | st.integers(0, 2**32 - 1) | st.sampled_from([DIR, REG, 0o120777, 0xFFFFFFFF]),
        st.none() | st.integers(0, 2**64 - 1),
    ),
)
ANSWERS = st.sampled_from(
    [paramiko.sftp.SFTP_FAILURE, paramiko.sftp.SFTP_BAD_MESSAGE, paramiko.sftp.SFTP_NO_SUCH_FILE, 8, 99]
)
ACTIONS: dict[str, Callable[[SSHExecutor], object]] = {
    "open": lambda x: x.write_bytes(P, b"x"),
    "remove": lambda x: x.remove(P),
    "rmdir": lambda x: x.rmdir(P),
    "mkdir": lambda x: x.makedirs(P),
    "rename": lambda x: x.rename(P, Q),
}


def test_whatever_a_lying_server_answers_the_error_is_typed_and_bounded() -> None:
    shared = World()
    with lying_sftp(shared) as executor:

        @settings(max_examples=300, deadline=None)
        @given(
            op=st.sampled_from(sorted(ACTIONS)),
            answer=ANSWERS,
            lies=st.dictionaries(st.sampled_from([P, Q, "/t"]), LIES, max_size=3),
            listing=st.lists(st.sampled_from([".", "..", "x", "", "a" * 300]), max_size=5),
            text=st.binary(max_size=600),
        )
        def check(op: str, answer: int, lies: dict[str, Any], listing: list[str], text: bytes) -> None:
            shared.fail, shared.lies, shared.listing, shared.text = (
                {op: answer},
                lies,
                {P: listing, Q: listing},
                text,
            )
            try:
                ACTIONS[op](executor)
            except FileOperationError as err:
                assert err.errno in CAUSES, err
                assert err.filename in (P, "/t") and len(str(err)) < 600  # makedirs names the parent
            else:
                assert op == "mkdir"  # the lies said a directory is there already

        check()


def test_a_reply_whose_counts_promise_more_than_it_holds_drops_the_session_at_once(
    world: World, sftp: SSHExecutor
) -> None:
    """paramiko pads a short reply with zeros: one ATTRS reply with an extended-attribute count of
    2**32 - 1 kept it parsing for half an hour (the SFTP lock held); so could any entry of a listing."""
    world.add("/t/p/f", "/t/q")
    world.fail = {"open": paramiko.sftp.SFTP_FAILURE, "rmdir": paramiko.sftp.SFTP_FAILURE}
    world.extended_lie = True
    _drops_at_once(lambda: sftp.stat(Q))
    _drops_at_once(lambda: sftp.write_bytes(Q, b"x"))  # the stat that explains the failure
    world.extended_lie, world.readdir_lie = False, True
    _drops_at_once(lambda: sftp.rmdir(P))  # explaining it reads the directory's first names
    world.readdir_lie = False
    assert _files(sftp).stat(Q).type == "file"  # a new session, answering again


def _drops_at_once(action: Callable[[], object]) -> None:
    """``action`` ends in ConnectionLost within seconds (in a thread: a regression hangs there)."""
    ended: list[BaseException] = []

    def run() -> None:
        try:
            action()
        except BaseException as exc:
            ended.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "still parsing the reply"
    assert len(ended) == 1 and isinstance(ended[0], ConnectionLost), ended
    assert "counts promise more" in str(ended[0])


def test_an_oversized_stat_reply_drops_the_session_instead_of_escaping_untyped(
    world: World, sftp: SSHExecutor
) -> None:
    big = SFTPAttributes.from_stat(os_stat(REG))
    big.attr = {"k": "x" * (SFTP_MAX_PACKET + 1)}
    world.add("/t/q")
    world.lies = {P: big}
    with pytest.raises(ConnectionLost, match="refused"):
        sftp.stat(P)  # was paramiko.SFTPError, the session left mid-reply
    assert _files(sftp).stat(Q).type == "file"


def _attrs(name: str, mode: int | None, size: int | None, extended: dict[str, str]) -> SFTPAttributes:
    attrs = _with_attrs(mode, size)
    attrs.filename, attrs.attr = name, extended
    if mode is not None:
        attrs.st_uid = attrs.st_gid = attrs.st_atime = attrs.st_mtime = 1
    return attrs


ENTRIES = st.builds(
    _attrs,
    st.text(max_size=20),
    st.none() | st.integers(0, 2**32 - 1),
    st.none() | st.integers(0, 2**64 - 1),
    st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
)


def _packed(entries: list[SFTPAttributes], *, names: bool) -> bytes:
    msg = paramiko.Message()
    msg.add_int(7)
    if names:
        msg.add_int(len(entries))
    for a in entries:
        if names:
            msg.add_string(a.filename)
            msg.add_string("long " + a.filename)
        a._pack(msg)
    return msg.asbytes()


@given(entries=st.lists(ENTRIES, max_size=4), names=st.booleans(), data=st.data())
def test_counts_are_checked_against_the_bytes_of_a_reply(
    entries: list[SFTPAttributes], names: bool, data: st.DataObject
) -> None:
    from paramiko.sftp import CMD_ATTRS, CMD_NAME

    from sandbox_rt.ssh.wire import _counts_fit

    kind = CMD_NAME if names else CMD_ATTRS
    body = _packed(entries if names else entries[:1] or [SFTPAttributes()], names=names)
    assert _counts_fit(kind, body)  # what paramiko packs fits
    cut = data.draw(st.integers(4, len(body) - 1))  # past the request id, short of the end
    assert not _counts_fit(kind, body[:cut])


def test_a_count_past_the_bytes_is_refused() -> None:
    from paramiko.sftp import CMD_ATTRS, CMD_NAME

    from sandbox_rt.ssh.wire import _counts_fit

    names = paramiko.Message()
    names.add_int(7)
    names.add_int(0xFFFFFFFF)
    assert not _counts_fit(CMD_NAME, names.asbytes())
    attrs = paramiko.Message()
    attrs.add_int(7)
    attrs.add_int(SFTPAttributes.FLAG_EXTENDED)
    attrs.add_int(0xFFFFFFFF)
    assert not _counts_fit(CMD_ATTRS, attrs.asbytes())
    attrs.add_string("k")
    assert not _counts_fit(CMD_ATTRS, attrs.asbytes())  # a key without its value


def test_the_mount_table_is_parsed_strictly() -> None:
    text = (
        "22 1 0:1 / / rw,relatime - overlay overlay rw\n"
        "23 22 0:2 / /mnt/a\\040b rw - ext4 /dev/x ro,errors=remount-ro\n"  # read-only by its super block
        "24 22 0:3 / /sys ro,nosuid - sysfs sysfs rw\n"
        "garbage without fields\n"
        "25 22 0:4 / relative rw - ext4 /dev/y rw\n"
        "26 22 0:5 / /mnt/a\\040b/c rw - tmpfs t rw\n"
    )
    mounts = parse_mountinfo(text)
    assert [(m.point, m.read_only) for m in mounts] == [
        ("/", False),
        ("/mnt/a b", True),
        ("/sys", True),
        ("/mnt/a b/c", False),
    ]
    assert mount_of(mounts, "/mnt/a b/x") == mounts[1] and mount_of(mounts, "/mnt/a b/c/d") == mounts[3]
    assert mount_of(mounts, "/mnt/a bc") == mounts[0]
    assert len(parse_mountinfo("1 1 0:1 / /x rw - t t rw\n" * (MOUNTS_MAX + 5))) == MOUNTS_MAX
