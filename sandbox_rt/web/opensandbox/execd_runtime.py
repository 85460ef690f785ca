"""What execd needs of a sandbox, and the helpers every execd route shares: the route prefixes (from
:mod:`.state`), the attached sandbox, and a command run by argv whose failure becomes a typed error.

Everything execd does runs inside the sandbox as its user, over the SSH connection the server
already holds: no agent runs in the sandbox, nothing is read or written on the host.
"""

from __future__ import annotations

import errno

from fastapi import APIRouter, Depends

from ...errors import FileOperationError
from ...models import ExecResult
from ...protocols import SandboxLike
from ..bodies import strict_query
from ..params import Context
from . import state

__all__ = [
    "EGRESS_PREFIX",
    "EXECD_PREFIX",
    "ExecdSandbox",
    "execd_router",
    "file_error",
    "run_argv",
    "sandbox_of",
]

_SAMPLE_ID = "sbx-0000000000"


def _template(base_path: str) -> str:
    """``/sandboxes/sbx-0000000000/proxy/44772`` -> ``/sandboxes/{id}/proxy/44772``: the route
    prefix follows whatever :mod:`.state` says the endpoints are."""
    if base_path.count(_SAMPLE_ID) != 1:
        raise AssertionError(f"the execd base path {base_path!r} does not name its sandbox once")
    return base_path.replace(_SAMPLE_ID, "{id}")


EXECD_PREFIX = _template(state.execd_base_path(_SAMPLE_ID))
EGRESS_PREFIX = _template(state.egress_base_path(_SAMPLE_ID))


def execd_router(prefix: str = EXECD_PREFIX) -> APIRouter:
    """A router of execd routes under ``prefix``, each checking its query string strictly."""
    return APIRouter(prefix=prefix, dependencies=[Depends(strict_query)])


# what execd uses of a sandbox: the one protocol of every door (sandbox_rt.protocols)
ExecdSandbox = SandboxLike


def sandbox_of(ctx: Context, sandbox_id: str) -> ExecdSandbox:
    """The attached sandbox ``sandbox_id`` (SandboxNotFound, SandboxError if it is not running)."""
    return ctx.cache.get(sandbox_id)


# what a command's stderr says -> (errno, how we say it); the first line that matches wins
_SAID = (
    ("No such file or directory", errno.ENOENT, "no such file in the sandbox"),
    ("Permission denied", errno.EACCES, "permission denied in the sandbox"),
    ("Operation not permitted", errno.EPERM, "not permitted in the sandbox (commands run as its user)"),
    ("Not a directory", errno.ENOTDIR, "a parent is not a directory"),
    ("Is a directory", errno.EISDIR, "is a directory"),
    ("invalid user", errno.EINVAL, "no such user or group in the sandbox"),
    ("invalid group", errno.EINVAL, "no such user or group in the sandbox"),
    ("No space left on device", errno.ENOSPC, "no space left in the sandbox"),
    ("Disk quota exceeded", errno.EDQUOT, "disk quota exceeded in the sandbox"),
)


def file_error(what: str, path: str, result: ExecResult) -> FileOperationError:
    """The typed error of a failed file command, from its stderr (bounded: the first 200 bytes of its
    last line are quoted, the sandbox's text is never trusted for more)."""
    text = result.stderr[-4096:].decode("utf-8", "replace")
    for said, code, why in _SAID:
        if said in text:
            return FileOperationError(code, f"{what}: {why}", path)
    lines = [line for line in text.splitlines() if line.strip()]
    detail = lines[-1][:200] if lines else f"exit status {result.exit_code}"
    return FileOperationError(errno.EIO, f"{what}: {detail}", path)


def run_argv(
    sb: ExecdSandbox,
    argv: list[str],
    *,
    what: str,
    path: str,
    timeout: float = 60.0,
    max_output: int = 64 << 10,
) -> ExecResult:
    """Run ``argv`` (quoted word by word) as the sandbox user; a non-zero exit is the typed error of
    :func:`file_error`."""
    result = sb.exec(argv, timeout=timeout, max_output=max_output)
    if result.exit_code != 0:
        raise file_error(what, path, result)
    return result
