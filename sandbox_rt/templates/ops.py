"""Apply a template's steps to a build sandbox with pyinfra (``pyinfra.api``: State, add_op, run_ops).

Each step is one pyinfra run of its own (a fresh State over the same connection): its operations'
facts are read after the earlier steps ran (pyinfra reads facts when an operation is added), and a
failure stops the build at that step with that step's output. ``env`` and ``workdir`` become the
inventory's ``_env`` / ``_chdir`` for every later operation, a user's deploy included.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from pyinfra.api.config import Config
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.deploy import add_deploy
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.inventory import Inventory
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops
from pyinfra.api.state import State
from pyinfra.operations import apt, files, npm, pip, server

from ..errors import TemplateBuildError
from ..sandbox import Sandbox
from .connector import SandboxConnector
from .steps import AptInstall, Copy, Deploy, Env, NpmInstall, PipInstall, Run, Step, Workdir

__all__ = ["apply_steps"]

# pyinfra logs each failed command's output at ERROR: on_log has it already (no stderr copy through
# logging's last-resort handler in a process that configured no logging)
logging.getLogger("pyinfra").addHandler(logging.NullHandler())

HOST_NAME = "build-sandbox"
ENVIRONMENT_FILE = "/etc/environment"  # read by pam_env for every sshd session of the sandbox
_OUTPUT_KEPT = 200  # lines of a failed step's output the error carries


@dataclasses.dataclass
class _Context:
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    workdir: str | None = None

    def host_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if self.env:
            data["_env"] = dict(self.env)
        if self.workdir:
            data["_chdir"] = self.workdir
        return data


def _state(sandbox: Sandbox, ctx: _Context, log: Callable[[str], None], timeout_s: float) -> State:
    inventory = Inventory(([HOST_NAME], ctx.host_data()))
    for host in inventory:
        host.connector_cls = SandboxConnector
    state = State(inventory, Config(), check_for_changes=False)
    for host in inventory:
        connector = host.connector
        assert isinstance(connector, SandboxConnector)
        connector.bind(sandbox, log, timeout_s)
    connect_all(state)
    return state


def _add(state: State, step: Step, ctx: _Context) -> None:
    env = {"DEBIAN_FRONTEND": "noninteractive", **ctx.env}
    if isinstance(step, AptInstall):
        add_op(state, apt.packages, packages=list(step.packages), update=True, no_recommends=True, _env=env)
    elif isinstance(step, PipInstall):
        extra = ["--break-system-packages", "--no-cache-dir", "--disable-pip-version-check"]
        if step.index_url:
            extra += ["--index-url", step.index_url]
            if urlsplit(step.index_url).scheme == "http":
                extra += ["--trusted-host", str(urlsplit(step.index_url).hostname)]
        add_op(
            state, pip.packages, packages=list(step.packages), pip="pip3", extra_install_args=" ".join(extra)
        )
    elif isinstance(step, NpmInstall):
        npm_env = {**ctx.env, **({"npm_config_registry": step.registry} if step.registry else {})}
        add_op(state, npm.packages, packages=list(step.packages), _env=npm_env)
    elif isinstance(step, Run):
        add_op(state, server.shell, commands=[step.command])
    elif isinstance(step, Copy):
        if step.is_dir:
            add_op(state, files.sync, src=str(step.local), dest=step.remote, delete=False)
        else:
            mode = f"{step.local.stat().st_mode & 0o7777:o}"
            add_op(state, files.put, src=str(step.local), dest=step.remote, mode=mode, create_remote_dir=True)
    elif isinstance(step, Env):
        for name, value in step.values:
            line = f'{name}="{value}"'
            add_op(state, files.line, path=ENVIRONMENT_FILE, line=f"^{name}=.*$", replace=line)
    elif isinstance(step, Workdir):
        add_op(state, files.directory, path=step.path, present=True, _chdir="/")
    elif isinstance(step, Deploy):
        add_deploy(state, step.fn)
    else:  # pragma: no cover - every Step subclass is handled above
        raise TypeError(f"unknown step {step!r}")


def _after(step: Step, ctx: _Context) -> None:
    if isinstance(step, Env):
        ctx.env.update(dict(step.values))
    elif isinstance(step, Workdir):
        ctx.workdir = step.path


def _sink(output: list[str], log: Callable[[str], None]) -> Callable[[str], None]:
    """Each output line to ``log`` (indented) and the last lines kept in ``output``."""

    def sink(line: str) -> None:
        output.append(line)
        del output[:-_OUTPUT_KEPT]
        log(f"    {line}")

    return sink


def apply_steps(
    sandbox: Sandbox, steps: list[Step], log: Callable[[str], None], *, timeout_s: float = 1800.0
) -> None:
    """Run ``steps`` in order as root in ``sandbox``; TemplateBuildError naming the first that fails,
    with its output (the tail of it)."""
    ctx = _Context()
    for index, step in enumerate(steps, 1):
        label = f"step {index}/{len(steps)} {step.describe()}"
        log(f"==> {label}")
        output: list[str] = []
        state = _state(sandbox, ctx, _sink(output, log), timeout_s)
        problem = ""
        try:
            _add(state, step, ctx)
            run_ops(state)
        except PyinfraError as exc:
            problem = f"pyinfra: {exc}"
        except Exception as exc:  # a user's deploy may raise anything: it fails its step
            problem = f"{type(exc).__name__}: {exc}"
        finally:
            disconnect_all(state)
        results = [state.get_results_for_host(host) for host in state.inventory]
        if problem or any(r.error_ops for r in results) or state.failed_hosts:
            raise TemplateBuildError(
                f"{step.describe()} failed{': ' + problem if problem else ''}",
                step=label,
                detail="\n".join(output),
            )
        _after(step, ctx)
        log(f"    ok: {step.describe()}")
