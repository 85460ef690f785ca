"""execd's files: ``GET /files/info``, ``DELETE /files``, ``POST /files/permissions``, ``POST
/files/mv``, ``GET /files/search``, ``POST /files/replace`` and ``POST /files/upload`` (multipart).
``GET /files/download`` is :mod:`.execd_download`'s.

Every operation runs in the sandbox as its user (SFTP through ``sb.files``, or a command by argv);
nothing is read or written on the host. What the sandbox reports is checked (:mod:`.execd_fsinfo`).
"""

from __future__ import annotations

import errno
from typing import Annotated, Any, Literal

from fastapi import Depends, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from ...errors import ConfigError, FileOperationError
from ...validation import check_remote_path
from ..errors import json_type
from ..params import Ctx, SandboxId
from .execd_fsinfo import file_infos, search_files
from .execd_models import (
    MAX_ITEMS,
    FileMetadata,
    Permission,
    RenameItem,
    ReplaceItem,
    check_owner,
    model_of,
    octal_mode,
    parse_json,
    path_list,
    path_map,
    read_json,
)
from .execd_multipart import boundary_of, parse_multipart
from .execd_runtime import ExecdSandbox, execd_router, run_argv, sandbox_of

__all__ = ["REPLACE_MAX_BYTES", "apply_permission", "router"]

REPLACE_MAX_BYTES = 16 << 20  # a file /files/replace rewrites (read into memory, then written back)

router = execd_router()

Paths = Annotated[list[str] | None, Query(alias="path", description="Absolute path; repeatable.")]


def apply_permission(
    sb: ExecdSandbox, path: str, mode: int | None, owner: str | None, group: str | None
) -> None:
    """chmod (``mode`` in octal digits, e.g. 755) and chown (names or numbers) inside the sandbox."""
    bits = octal_mode(mode)
    user, grp = check_owner(owner, "owner"), check_owner(group, "group")
    if bits is not None:
        run_argv(sb, ["chmod", "--", f"{bits:o}", path], what="chmod", path=path)
    if user is not None or grp is not None:
        spec = (user or "") + (f":{grp}" if grp is not None else "")
        run_argv(sb, ["chown", "--", spec, path], what="chown", path=path)


@router.get("/files/info", summary="FileInfo of each path (symlinks not followed)")
def files_info(ctx: Ctx, id: SandboxId, path: Paths = None) -> dict[str, Any]:
    paths = path_list(path, "info")
    return file_infos(sandbox_of(ctx, id), paths)


@router.delete("/files", summary="Delete files (not directories); absent ones are fine")
def delete_files(ctx: Ctx, id: SandboxId, path: Paths = None) -> Response:
    paths = path_list(path, "delete")
    sb = sandbox_of(ctx, id)
    for p in paths:
        try:
            entry = sb.files.stat(p, follow_symlinks=False)
        except FileOperationError as exc:
            if exc.errno == errno.ENOENT:
                continue
            raise
        if entry.type == "dir":
            raise FileOperationError(errno.EISDIR, "delete: a directory (use DELETE /directories)", p)
        sb.files.remove(p)
    return Response(status_code=200)


@router.post("/files/permissions", summary="chmod/chown each path")
def chmod_files(ctx: Ctx, id: SandboxId, body: Annotated[Any, Depends(read_json("permissions"))]) -> Response:
    entries = path_map(body, Permission, "permissions")
    sb = sandbox_of(ctx, id)
    for p, perm in entries.items():
        if perm.mode is None and perm.owner is None and perm.group is None:
            raise ConfigError(f"entry {p!r:.80}: give mode, owner or group")
        apply_permission(sb, p, perm.mode, perm.owner, perm.group)
    return Response(status_code=200)


@router.post("/files/mv", summary="Move or rename each src to its dest (the dest's directory must exist)")
def move_files(ctx: Ctx, id: SandboxId, body: Annotated[Any, Depends(read_json("mv"))]) -> Response:
    if not isinstance(body, list) or not body:
        raise ConfigError(f"the mv body must be a non-empty array of {{src, dest}}, not {json_type(body)}")
    if len(body) > MAX_ITEMS:
        raise ConfigError(f"the mv body has {len(body)} items; at most {MAX_ITEMS} are allowed")
    items = [model_of(RenameItem, item, f"item {n}") for n, item in enumerate(body)]
    moves = [(check_remote_path(i.src, "src"), check_remote_path(i.dest, "dest")) for i in items]
    sb = sandbox_of(ctx, id)
    for src, dest in moves:
        sb.files.rename(src, dest)
    return Response(status_code=200)


@router.get("/files/search", summary="Files below a directory whose names match a glob")
def search(
    ctx: Ctx,
    id: SandboxId,
    path: Annotated[str, Query(description="The directory searched (a symlink to one is followed).")],
    pattern: Annotated[str | None, Query(description="Glob on file names; default **.")] = None,
) -> list[dict[str, Any]]:
    return search_files(sandbox_of(ctx, id), path, pattern)


@router.post("/files/replace", summary="Replace every occurrence of old by new in each file")
def replace_content(
    ctx: Ctx,
    id: SandboxId,
    body: Annotated[Any, Depends(read_json("replace"))],
    verbose: Annotated[Literal["true", "false"], Query()] = "false",
) -> Response:
    entries = path_map(body, ReplaceItem, "replace")
    for p, item in entries.items():
        if not item.old:
            raise ConfigError(f"entry {p!r:.80}: field 'old' must not be empty")
    sb = sandbox_of(ctx, id)
    counts: dict[str, dict[str, int]] = {}
    for p, item in entries.items():
        old, new = item.old.encode("utf-8"), item.new.encode("utf-8")
        data = sb.read_file(p, max_bytes=REPLACE_MAX_BYTES)
        count = data.count(old)
        if count:
            sb.write_file(p, data.replace(old, new))
        counts[p] = {"replacedCount": count}
    if verbose == "true":
        return JSONResponse(counts)
    return Response(status_code=200)


def _uploads(body: bytes, content_type: str | None) -> list[tuple[FileMetadata, bytes]]:
    """(metadata, bytes) of each file of an upload: a ``metadata`` part (JSON) before each ``file``."""
    pending: FileMetadata | None = None
    out: list[tuple[FileMetadata, bytes]] = []
    for part in parse_multipart(body, boundary_of(content_type)):
        if part.name == "metadata":
            if pending is not None:
                raise ConfigError("upload: two metadata parts in a row (each file part follows its metadata)")
            pending = model_of(FileMetadata, parse_json(part.data, "metadata part"), "metadata part")
            check_remote_path(pending.path)
            octal_mode(pending.mode)
            check_owner(pending.owner, "owner")
            check_owner(pending.group, "group")
        elif part.name == "file":
            if pending is None:
                raise ConfigError("upload: a file part without a metadata part before it")
            out.append((pending, part.data))
            pending = None
        else:
            raise ConfigError(f"upload: unknown part {part.name[:60]!r} (expected metadata and file)")
    if pending is not None:
        raise ConfigError("upload: the last metadata part has no file part after it")
    if not out:
        raise ConfigError("upload: no file in the request")
    return out


@router.post("/files/upload", summary="Upload files: multipart metadata + file pairs")
async def upload_files(ctx: Ctx, request: Request, id: SandboxId) -> Response:
    body = await request.body()  # read by the gate already, within its limits
    files = _uploads(body, request.headers.get("content-type"))
    del body

    def write() -> None:
        sb = sandbox_of(ctx, id)
        for meta, data in files:
            sb.write_file(meta.path, data, mode=octal_mode(meta.mode))
            if meta.owner or meta.group:
                apply_permission(sb, meta.path, None, meta.owner, meta.group)

    await run_in_threadpool(write)
    return Response(status_code=200)
