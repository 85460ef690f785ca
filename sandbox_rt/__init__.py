"""sandbox_rt: ephemeral, hardened, network-isolated Linux sandboxes for LLM agents.

>>> import sandbox_rt
>>> mgr = sandbox_rt.Manager.from_env()
>>> with mgr.create(cpus=1, memory_mb=512) as sb:
...     print(sb.exec("echo hi").text)
"""

from .aio import AsyncExecStream, AsyncManager, AsyncSandbox
from .config import Settings
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
    TemplateBuildError,
    VolumeNotAllowed,
    VolumeNotFound,
)
from .manager import GcResult, Manager
from .models import (
    ExecResult,
    OutputChunk,
    ResourceUsage,
    SandboxRecord,
    SandboxSpec,
    SandboxStatus,
    SnapshotInfo,
    VolumeInfo,
    VolumeMount,
)
from .sandbox import ExecStream, Sandbox
from .templates import Template

__version__ = "0.1.0"

__all__ = [
    "AsyncExecStream",
    "AsyncManager",
    "AsyncSandbox",
    "BackendError",
    "CommandTimeout",
    "ConfigError",
    "ConnectionLost",
    "ExecError",
    "ExecResult",
    "ExecStream",
    "FileOperationError",
    "FirewallDisabled",
    "GcResult",
    "HostKeyMismatch",
    "Manager",
    "OutputChunk",
    "PermissionDenied",
    "PolicyDenied",
    "ProcessNotFound",
    "ResourceUsage",
    "Sandbox",
    "SandboxError",
    "SandboxNotFound",
    "SandboxNotReady",
    "SandboxRecord",
    "SandboxSpec",
    "SandboxStatus",
    "Settings",
    "SnapshotInfo",
    "SnapshotNotFound",
    "StateConflict",
    "Template",
    "TemplateBuildError",
    "VolumeInfo",
    "VolumeMount",
    "VolumeNotAllowed",
    "VolumeNotFound",
    "__version__",
    "remote",
]


def __getattr__(name: str) -> object:
    """``sandbox_rt.remote`` (the HTTP API's clients) is imported on first use: httpx stays out of
    processes that never use it."""
    if name == "remote":
        import importlib

        return importlib.import_module(".remote", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
