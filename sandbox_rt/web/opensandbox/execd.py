"""OpenSandbox's execd (commands, files, directories, metrics), served by the host over SSH: no
agent runs inside the sandbox."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from ..bodies import strict_query

__all__ = ["router"]

router = APIRouter(dependencies=[Depends(strict_query)])
