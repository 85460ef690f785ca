"""Background commands over HTTP (``/v1/sandboxes/{id}/processes``): start one, list them, read
its output from byte offsets (a stateless reader: the client keeps the offsets), write to and
close its stdin, wait for it, kill it. The command runs in its own session inside the sandbox
(:mod:`sandbox_rt.background`), so it outlives the request, the server's SSH connection and the
server itself; everything it reports back is parsed and bounded on the host.
"""

from __future__ import annotations

import signal
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import Field

from ..errors import CommandTimeout, ConfigError
from ..models import ProcessInfo
from . import schemas as s
from .bodies import strict_query
from .errors import encode_output
from .kinds import Kind
from .openapi import errors
from .params import RAW_REQUEST, Ctx, SandboxId, json_body, json_request

__all__ = ["router"]

MAX_PID = 1 << 22  # the kernel's largest pid_max
DEFAULT_LOG_BYTES = 1 << 20
MAX_LOG_BYTES = 64 << 20
MAX_OFFSET = 1 << 62

router = APIRouter(dependencies=[Depends(strict_query)])

Pid = Annotated[int, Path(ge=2, lt=MAX_PID, description="The command's process group id (its pid).")]


class StartProcessRequest(s.RequestBody):
    command: Annotated[Any, Kind("command", **s.COMMAND_DOC)]
    cwd: Annotated[Any, Kind("string", nullable=True, pattern=s.ABSOLUTE_PATH_PATTERN)] = Field(
        default=None, description="Absolute path in the sandbox."
    )
    env: Annotated[Any, Kind("string_map", nullable=True, **s.ENV_DOC)] = None


class WaitRequest(s.RequestBody):
    timeout: Annotated[Any, Kind("number", nullable=True, exclusiveMinimum=0)] = Field(
        default=None, description="Seconds to wait at most (504 with the output so far); null: until it ends."
    )


class KillRequest(s.RequestBody):
    signal: Annotated[Any, Kind("integer", minimum=1, maximum=64)] = Field(
        default=int(signal.SIGKILL), description="The signal sent to the command's whole process group."
    )


class ProcessList(s.Answer):
    processes: list[ProcessInfo] = Field(description="Newest first; at most 1000.")


class ProcessLogs(s.Answer):
    encoding: str = Field(json_schema_extra={"enum": ["utf-8", "base64"]})
    stdout: str
    stderr: str
    stdout_offset: int = Field(ge=0, description="Where the next read of stdout starts.")
    stderr_offset: int = Field(ge=0, description="Where the next read of stderr starts.")


class ProcessExit(s.Answer):
    pid: int
    exit_code: int


MODELS = (StartProcessRequest, WaitRequest, KillRequest)


@router.post(
    "/v1/sandboxes/{id}/processes",
    operation_id="startProcess",
    summary="Start a command in the background (its own session; stdin is a pipe)",
    status_code=201,
    response_model=ProcessInfo,
    responses={
        201: {
            "description": "Started.",
            "headers": {
                "Location": {
                    "schema": {"type": "string"},
                    "description": "/v1/sandboxes/{id}/processes/{pid}",
                }
            },
        },
        **errors("400", "401", "404", "409", "502", "503"),
    },
    openapi_extra=json_request(StartProcessRequest),
)
def start_process(
    ctx: Ctx,
    response: Response,
    id: SandboxId,
    body: Annotated[StartProcessRequest, Depends(json_body(StartProcessRequest, "process"))],
) -> ProcessInfo:
    p = ctx.cache.get(id).commands.run(body.command, background=True, cwd=body.cwd, env=body.env)
    response.headers["Location"] = f"/v1/sandboxes/{id}/processes/{p.pid}"
    return ProcessInfo(pid=p.pid, handle=p.handle, command=p.command, running=True, exit_code=None)


@router.get(
    "/v1/sandboxes/{id}/processes",
    operation_id="listProcesses",
    summary="The sandbox's background commands, running and ended",
    response_model=ProcessList,
    responses=errors("400", "401", "404", "409", "502"),
)
def list_processes(ctx: Ctx, id: SandboxId) -> ProcessList:
    return ProcessList(processes=ctx.cache.get(id).commands.list())


@router.get(
    "/v1/sandboxes/{id}/processes/{pid}",
    operation_id="getProcess",
    summary="One background command: running or its exit code",
    response_model=ProcessInfo,
    responses=errors("400", "401", "404", "409", "502"),
)
def get_process(ctx: Ctx, id: SandboxId, pid: Pid) -> ProcessInfo:
    return ctx.cache.get(id).commands.connect(pid).info()


@router.get(
    "/v1/sandboxes/{id}/processes/{pid}/logs",
    operation_id="readProcessLogs",
    summary="What the command printed from the given byte offsets on (at most max_bytes of each)",
    response_model=ProcessLogs,
    responses=errors("400", "401", "404", "409", "502"),
)
def read_process_logs(
    ctx: Ctx,
    request: Request,
    id: SandboxId,
    pid: Pid,
    stdout_offset: Annotated[
        int, Query(ge=0, le=MAX_OFFSET, description="Bytes of stdout read already.")
    ] = 0,
    stderr_offset: Annotated[
        int, Query(ge=0, le=MAX_OFFSET, description="Bytes of stderr read already.")
    ] = 0,
    max_bytes: Annotated[int, Query(ge=1, le=MAX_LOG_BYTES)] = DEFAULT_LOG_BYTES,
    encoding: Annotated[
        str,
        Query(
            description="UTF-8 text (a character split by an offset becomes U+FFFD) or base64 of the "
            "exact bytes.",
            json_schema_extra={"enum": ["utf-8", "base64"]},
        ),
    ] = "utf-8",
) -> ProcessLogs:
    if encoding not in ("utf-8", "base64"):
        raise ConfigError(f"query parameter encoding={encoding!r:.30} must be utf-8 or base64")
    request.state.encoding = encoding
    p = ctx.cache.get(id).commands.connect(pid)
    out, err = p.logs_from(stdout_offset, stderr_offset, max_bytes=max_bytes)
    return ProcessLogs(
        encoding=encoding,
        stdout=encode_output(out, encoding),
        stderr=encode_output(err, encoding),
        stdout_offset=stdout_offset + len(out),
        stderr_offset=stderr_offset + len(err),
    )


@router.post(
    "/v1/sandboxes/{id}/processes/{pid}/stdin",
    operation_id="writeProcessStdin",
    summary="Write the raw body to the command's stdin",
    status_code=204,
    response_class=Response,
    responses={204: {"description": "Written."}, **errors("400", "401", "404", "409", "411", "413", "502")},
    openapi_extra=RAW_REQUEST,
)
async def write_process_stdin(ctx: Ctx, request: Request, id: SandboxId, pid: Pid) -> Response:
    data = await request.body()  # read by the gate already

    def send() -> None:
        ctx.cache.get(id).commands.connect(pid).send_stdin(data)

    await run_in_threadpool(send)
    return Response(status_code=204)


@router.delete(
    "/v1/sandboxes/{id}/processes/{pid}/stdin",
    operation_id="closeProcessStdin",
    summary="Close the command's stdin (it reads EOF once it has read what was sent)",
    status_code=204,
    response_class=Response,
    responses={204: {"description": "Closed."}, **errors("400", "401", "404", "409", "502")},
)
def close_process_stdin(ctx: Ctx, id: SandboxId, pid: Pid) -> Response:
    ctx.cache.get(id).commands.connect(pid).close_stdin()
    return Response(status_code=204)


@router.post(
    "/v1/sandboxes/{id}/processes/{pid}/wait",
    operation_id="waitProcess",
    summary="Wait for the command to end; its exit code",
    response_model=ProcessExit,
    responses=errors("400", "401", "404", "409", "502", "504"),
    openapi_extra=json_request(WaitRequest, required=False),
)
def wait_process(
    ctx: Ctx,
    id: SandboxId,
    pid: Pid,
    body: Annotated[WaitRequest, Depends(json_body(WaitRequest, "wait", required=False))],
) -> ProcessExit:
    process = ctx.cache.get(id).commands.connect(pid)
    try:
        return ProcessExit(pid=pid, exit_code=process.wait(body.timeout))
    except CommandTimeout as exc:  # the output is read from the logs route, bounded; not here
        raise CommandTimeout(exc.command, exc.timeout, b"", b"") from None


@router.post(
    "/v1/sandboxes/{id}/processes/{pid}/kill",
    operation_id="killProcess",
    summary="Send a signal (default SIGKILL) to the command's whole process group",
    response_model=ProcessInfo,
    responses=errors("400", "401", "404", "409", "502"),
    openapi_extra=json_request(KillRequest, required=False),
)
def kill_process(
    ctx: Ctx,
    id: SandboxId,
    pid: Pid,
    body: Annotated[KillRequest, Depends(json_body(KillRequest, "kill", required=False))],
) -> ProcessInfo:
    p = ctx.cache.get(id).commands.connect(pid)
    p.kill(body.signal)
    return p.info()
