"""OpenSandbox's execd (commands, bash sessions, files, directories, metrics) and the egress API's
``/policy``, served by the host over SSH: no agent runs inside the sandbox. Each sandbox's routes
are under the base paths :mod:`.state` names (``/sandboxes/{id}/proxy/44772`` for execd,
``.../18080`` for egress), which the lifecycle API's endpoints answer.

The routes live in small modules: :mod:`.execd_commands` (``/ping``, ``/command``),
:mod:`.execd_sessions` (``/session``), :mod:`.execd_files` and :mod:`.execd_download` (``/files``),
:mod:`.execd_dirs` (``/directories``), :mod:`.execd_metrics` (``/metrics``) and
:mod:`.execd_policy` (``/policy``).
"""

from __future__ import annotations

from fastapi import APIRouter

from . import (
    execd_commands,
    execd_dirs,
    execd_download,
    execd_files,
    execd_metrics,
    execd_policy,
    execd_sessions,
)

__all__ = ["router"]

# one flat router of the modules' routes (each checks its query string strictly): the app's 405
# answers read the routes' paths from it
router = APIRouter()
for _part in (
    execd_commands.router,
    execd_sessions.router,
    execd_files.router,
    execd_download.router,
    execd_dirs.router,
    execd_metrics.router,
    *execd_policy.routers,
):
    router.routes.extend(_part.routes)
