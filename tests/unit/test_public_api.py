"""The public API is exactly what ``sandbox_rt.__all__`` lists, and all of it is importable."""

import inspect

import sandbox_rt
from sandbox_rt import errors

EXPECTED = {
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
    "VolumeInfo",
    "VolumeMount",
    "VolumeNotAllowed",
    "VolumeNotFound",
    "StateConflict",
    "Template",
    "TemplateBuildError",
    "__version__",
    "remote",
}
SUBPACKAGES = {"remote"}  # in __all__, imported on first use


def test_all_is_the_public_api() -> None:
    assert set(sandbox_rt.__all__) == EXPECTED
    for name in sandbox_rt.__all__:
        assert hasattr(sandbox_rt, name), name
    public = {n for n in dir(sandbox_rt) if not n.startswith("_")}
    modules = {n for n in public if inspect.ismodule(getattr(sandbox_rt, n))}
    assert public - modules == EXPECTED - {"__version__"} - SUBPACKAGES
    assert modules >= SUBPACKAGES


def test_remote_is_imported_on_first_use() -> None:
    import subprocess
    import sys

    code = "import sys, sandbox_rt; assert 'httpx' not in sys.modules; sandbox_rt.remote.Client; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def test_every_error_is_a_sandbox_error() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, sandbox_rt.SandboxError), name


def test_typed_package_marker_is_shipped() -> None:
    from importlib.resources import files

    assert files("sandbox_rt").joinpath("py.typed").is_file()
