"""What the front doors call each error of :mod:`sandbox_rt.errors`, declared once (issue 36).

Each :class:`ErrorName` row says what an error (and its subclasses, unless a row of their own comes
first) is called: its ``code`` (the MCP tool error's, the finest), and its HTTP status and code (the
native HTTP API's, also the OpenSandbox dialect's in capitals; a code several rows share is told
apart by the body's ``type``). The HTTP APIs answer with :func:`http_error` of it, the MCP server
names its tool errors with it, the remote clients read an answer back through it
(:mod:`sandbox_rt.remote.error_map`). A new error class is a row here.
"""

from __future__ import annotations

import dataclasses

from .errors import (
    BackendError,
    CommandTimeout,
    ConfigError,
    ConnectionLost,
    ExecError,
    FileOperationError,
    FirewallDisabled,
    HostKeyMismatch,
    PermissionDenied,
    PolicyDenied,
    ProcessNotFound,
    SandboxError,
    SandboxNotFound,
    SandboxNotReady,
    SnapshotNotFound,
    StateConflict,
    VolumeNotAllowed,
    VolumeNotFound,
)

__all__ = ["ERROR_NAMES", "ErrorName", "error_name", "same_code"]


@dataclasses.dataclass(frozen=True)
class ErrorName:
    error: type[SandboxError]
    code: str
    status: int  # the HTTP status
    http: str = ""  # the HTTP code, if not ``code``

    @property
    def http_code(self) -> str:
        return self.http or self.code


# most specific first: the first row an error is an instance of names it
ERROR_NAMES: tuple[ErrorName, ...] = (
    ErrorName(StateConflict, "conflict", 409),  # a ConfigError the current state refuses
    ErrorName(VolumeNotAllowed, "volume_not_allowed", 403),  # a well-formed mount this host refuses
    ErrorName(PolicyDenied, "policy_denied", 403),  # what the door's operator does not let clients ask
    ErrorName(ConfigError, "invalid_argument", 400),
    ErrorName(SnapshotNotFound, "snapshot_not_found", 404, "not_found"),
    ErrorName(SandboxNotFound, "not_found", 404),
    ErrorName(ProcessNotFound, "not_found", 404),
    ErrorName(VolumeNotFound, "not_found", 404),
    # 504, not 408: clients and proxies may silently retry a 408, which would run the command again
    ErrorName(CommandTimeout, "command_timeout", 504),
    ErrorName(ExecError, "command_failed", 409, "conflict"),
    ErrorName(FileOperationError, "file_error", 500),  # the HTTP APIs tell its errno (web/errors.py)
    ErrorName(SandboxNotReady, "sandbox_not_ready", 503),
    ErrorName(HostKeyMismatch, "host_key_mismatch", 502, "connection_lost"),
    ErrorName(ConnectionLost, "connection_lost", 502),
    # the engine refused *our* credentials: not the caller's fault
    ErrorName(PermissionDenied, "backend_permission_denied", 502),
    ErrorName(FirewallDisabled, "firewall_disabled", 502, "backend_error"),
    ErrorName(BackendError, "backend_error", 502),
    ErrorName(SandboxError, "conflict", 409),  # any other: e.g. "sandbox ... is stopped, not running"
)


def error_name(exc: SandboxError) -> ErrorName:
    """The row that names ``exc``."""
    for row in ERROR_NAMES:
        if isinstance(exc, row.error):
            return row
    return ERROR_NAMES[-1]


def same_code(http_code: str, type_name: str) -> type[SandboxError] | None:
    """The error class an HTTP answer's ``code`` and ``type`` name: the ``type``'s row if it has that
    code (a code is refined only into one of its own rows), else the code's most general row; None
    for a code no row has."""
    rows = [r for r in ERROR_NAMES if r.http_code == http_code]
    for row in rows:
        if row.error.__name__ == type_name:
            return row.error
    return rows[-1].error if rows else None
