"""The names of the runtime's errors are declared once (sandbox_rt.error_names, issue 36): the HTTP
APIs answer by them, the MCP server names its tool errors by them, and the remote clients read an
answer back into the error it names."""

from __future__ import annotations

import errno

import pytest

from sandbox_rt import errors
from sandbox_rt.error_names import ERROR_NAMES, ErrorName, error_name
from sandbox_rt.errors import (
    CommandTimeout,
    ExecError,
    FileOperationError,
    ProcessNotFound,
    SandboxError,
    SandboxNotFound,
    SnapshotNotFound,
    VolumeNotFound,
)
from sandbox_rt.mcp.answers import error_code
from sandbox_rt.remote.error_map import ErrorContext, error_from_answer
from sandbox_rt.web.errors import error_for

SID = "sbx-0123456789"
# the errors whose constructor takes more than a message
MADE = {
    SandboxNotFound: lambda: SandboxNotFound(SID),
    SnapshotNotFound: lambda: SnapshotNotFound("snap1"),
    ProcessNotFound: lambda: ProcessNotFound(7),
    VolumeNotFound: lambda: VolumeNotFound("vol1"),
    CommandTimeout: lambda: CommandTimeout("sleep 9", 2.0, b"out", b""),
    ExecError: lambda: ExecError("false", 1, b"", b""),
    FileOperationError: lambda: FileOperationError(errno.EIO, "i/o error", "/x"),
}
CONTEXT = ErrorContext(sandbox_id=SID, snapshot="snap1", pid=7, volume="vol1", command="sleep 9", path="/x")


def _error(row: ErrorName) -> SandboxError:
    return MADE[row.error]() if row.error in MADE else row.error("it failed")


def test_every_error_class_has_a_row() -> None:
    named = {row.error for row in ERROR_NAMES}
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert error_name(cls.__new__(cls)).error in named  # its own row or an ancestor's
    assert ERROR_NAMES[-1].error is SandboxError  # the last row takes any other


@pytest.mark.parametrize("row", ERROR_NAMES, ids=lambda r: r.error.__name__)
def test_every_door_names_an_error_by_its_row(row: ErrorName) -> None:
    exc = _error(row)
    assert error_name(exc) == row
    answer = error_for(exc)
    assert (answer.status, answer.code) == (row.status, row.http_code)  # the HTTP APIs
    assert error_code(exc).partition(":")[0] == row.code  # MCP (a file error adds its errno)
    back = error_from_answer(answer.status, answer.code, answer.message, answer.body()["error"], CONTEXT)
    # the remote clients: the same class, or, for one only a command can make, its code's plainest
    assert type(back) is (SandboxError if row.error is ExecError else row.error)
