"""execd's directories: ``GET /directories/list?path=&depth=``, ``POST /directories`` (with their
parents, like ``mkdir -p``; then mode and owner) and ``DELETE /directories`` (with everything in
them; absent ones are fine; ``/`` never)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Query, Response

from ...files import MAX_LIST_DEPTH
from ..params import Ctx, SandboxId
from .execd_files import Paths, apply_permission
from .execd_fsinfo import list_directory
from .execd_models import Permission, check_owner, octal_mode, path_list, path_map, read_json
from .execd_runtime import execd_router, sandbox_of

__all__ = ["router"]

router = execd_router()


@router.get("/directories/list", summary="Entries below a directory, depth levels deep, in name order")
def list_dir(
    ctx: Ctx,
    id: SandboxId,
    path: Annotated[str, Query(description="Absolute path of the directory (not a symlink).")],
    depth: Annotated[int, Query(ge=0, le=MAX_LIST_DEPTH, description="1: its own entries.")] = 1,
) -> list[dict[str, Any]]:
    return list_directory(sandbox_of(ctx, id), path, depth)


@router.post("/directories", summary="Create directories and their parents; then mode, owner, group")
def make_dirs(ctx: Ctx, id: SandboxId, body: Annotated[Any, Depends(read_json("directories"))]) -> Response:
    entries = path_map(body, Permission, "directories")
    for perm in entries.values():  # all checked before anything is made
        octal_mode(perm.mode)
        check_owner(perm.owner, "owner")
        check_owner(perm.group, "group")
    sb = sandbox_of(ctx, id)
    for p, perm in entries.items():
        sb.files.mkdir(p, parents=True)
        apply_permission(sb, p, perm.mode, perm.owner, perm.group)
    return Response(status_code=200)


@router.delete("/directories", summary="Delete directories with everything in them")
def remove_dirs(ctx: Ctx, id: SandboxId, path: Paths = None) -> Response:
    paths = path_list(path, "delete")
    sb = sandbox_of(ctx, id)
    for p in paths:
        sb.files.remove(p, recursive=True)
    return Response(status_code=200)
