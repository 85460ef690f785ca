"""One exception tree for everything the runtime raises.

Every public call of :mod:`sandbox_rt` raises a :class:`SandboxError` subclass or nothing: callers
catch one type. Messages name the bad value or the failing step and, for commands, show the tail of
their output (never secrets).
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "CommandTimeout",
    "ConfigError",
    "ConnectionLost",
    "ExecError",
    "FileOperationError",
    "FirewallDisabled",
    "HostKeyMismatch",
    "PermissionDenied",
    "PolicyDenied",
    "SandboxError",
    "SandboxNotFound",
    "SandboxNotReady",
    "SnapshotNotFound",
    "TemplateBuildError",
    "VolumeNotAllowed",
    "VolumeNotFound",
]


def output_tail(data: bytes | str, limit: int = 2000) -> str:
    """The last ``limit`` characters of some output, decoded leniently, for error messages."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return text if len(text) <= limit else "..." + text[-limit:]


class SandboxError(Exception):
    """Base of every error the runtime raises."""


class ConfigError(SandboxError, ValueError):
    """A setting or an argument is invalid; raised before anything is changed."""


class StateConflict(ConfigError):
    """A well-formed request that the current state refuses: a snapshot name that is taken, root
    asked of a sandbox made without it. A ConfigError (callers that catch those still do); the HTTP
    API answers it 409, not 400."""


class PolicyDenied(ConfigError):
    """A front door that agents use (the HTTP APIs, the MCP server) refuses what its operator did
    not allow: ``root=True`` without ``--allow-root``, a cap switched off (0) or raised above the
    host's default without ``--allow-uncapped`` (:class:`sandbox_rt.policy.DoorPolicy`). The message
    names the option; nothing was made. The HTTP APIs answer it 403 ``policy_denied``."""


class BackendError(SandboxError):
    """The container engine (LXC, Proxmox) failed at a step; the message says which and why."""

    def __init__(self, message: str, *, step: str = "", detail: str = "") -> None:
        self.step = step
        self.detail = detail
        full = f"{step}: {message}" if step else message
        if detail:
            full += f"\n--- output (tail) ---\n{output_tail(detail)}"
        super().__init__(full)


class PermissionDenied(BackendError):
    """The engine refused the call for lack of a privilege (e.g. a PVE token without VM.Clone)."""


class FirewallDisabled(BackendError):
    """The firewall that gates a sandbox's network is not in force (PVE: the datacenter firewall
    is off, so no CT firewall applies); nothing was created or changed."""


class TemplateBuildError(BackendError):
    """A template build failed (``step``: which step or hardening control, ``detail``: its output,
    e.g. pyinfra's); nothing of the build is left (no build sandbox, no half template)."""


class SandboxNotFound(SandboxError, LookupError):
    """No sandbox with that id exists (or it was destroyed)."""

    def __init__(self, sandbox_id: str) -> None:
        self.sandbox_id = sandbox_id
        super().__init__(f"no sandbox with id {sandbox_id!r}")


class SnapshotNotFound(SandboxError, LookupError):
    """No snapshot with that name exists (or it was deleted, or on PVE its sandbox was destroyed)."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"no snapshot named {name!r}")


class VolumeNotFound(SandboxError, LookupError):
    """No named volume with that name exists (``Manager.volumes``; or it was removed), or a host
    directory or sub path a mount names is not there."""

    def __init__(self, name: str, message: str | None = None) -> None:
        self.name = name
        super().__init__(message or f"no volume named {name!r}")


class VolumeNotAllowed(ConfigError):
    """A mount's source is refused: a host path outside the directories the operator allows, or a
    symbolic link (or a way out) on the path inside a volume or an allowed directory. The HTTP API
    answers it 403."""


class ProcessNotFound(SandboxError, LookupError):
    """No background command with that pid in the sandbox (it was never started there, or its
    records went with the sandbox)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        super().__init__(f"no background command with pid {pid} in this sandbox")


class SandboxNotReady(SandboxError):
    """The sandbox did not become reachable (SSH) within the allowed time."""


class ConnectionLost(SandboxError):
    """The SSH connection to a sandbox failed or dropped."""


class HostKeyMismatch(ConnectionLost):
    """The sandbox presented an SSH host key other than the one pinned for it."""


class FileOperationError(SandboxError, OSError):
    """A file operation inside the sandbox failed (missing file, permission denied, ...)."""


class ExecError(SandboxError):
    """A command exited non-zero and the caller asked for ``check=True``."""

    def __init__(self, command: str, exit_code: int, stdout: bytes, stderr: bytes) -> None:
        self.command = command
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr
        tail = output_tail(stderr or stdout)
        super().__init__(f"command {command!r} exited {exit_code}\n--- output (tail) ---\n{tail}")


class CommandTimeout(SandboxError, TimeoutError):
    """A command ran past its timeout; its whole process group was killed.

    ``stdout`` and ``stderr`` hold what it printed until then.
    """

    def __init__(self, command: str, timeout: float, stdout: bytes, stderr: bytes) -> None:
        self.command = command
        self.timeout = timeout
        self.stdout = stdout
        self.stderr = stderr
        super().__init__(f"command {command!r} timed out after {timeout:g} s (process group killed)")
