"""The OpenSandbox lifecycle API (``/v1/sandboxes...``), mapped onto the runtime."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from ..bodies import strict_query

__all__ = ["router"]

router = APIRouter(dependencies=[Depends(strict_query)])
