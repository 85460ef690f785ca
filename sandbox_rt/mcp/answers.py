"""What the MCP tools answer: the structured results (pydantic models, published as each tool's
output schema), their text for the model, and the one place where the runtime's errors become MCP
tool errors (:func:`tool_error`)."""

from __future__ import annotations

import errno
import json
from typing import Literal

from mcp_types import CallToolResult, TextContent
from pydantic import BaseModel, Field

from ..error_names import error_name
from ..errors import CommandTimeout, FileOperationError, SandboxError
from ..models import EntryInfo, ExecResult, SandboxStatus
from ..protocols import SandboxLike

__all__ = ["command_answer", "error_code", "internal_error", "ok", "tool_error"]

DEFAULT_MAX_OUTPUT = 64 << 10  # bytes of each stream shown when the caller set none


# -- results -------------------------------------------------------------------------
class SandboxView(BaseModel):
    id: str
    hostname: str
    ip: str
    state: str
    cpus: float
    memory_mb: int
    disk_gb: int
    internet: bool
    egress: list[str]
    labels: dict[str, str]
    expires_at: float | None = Field(description="Unix time at which the sandbox is destroyed")
    uptime_s: float | None = None
    template: str = Field(default="default", description="the template it was cloned from")


class SandboxBrief(BaseModel):
    id: str
    hostname: str
    ip: str
    labels: dict[str, str]
    expires_at: float | None


class SandboxList(BaseModel):
    sandboxes: list[SandboxBrief]


class CommandResult(BaseModel):
    exit_code: int
    stdout: str = Field(description="UTF-8 (undecodable bytes replaced), at most max_output bytes")
    stderr: str
    duration_s: float
    truncated: bool = Field(description="true if output past max_output was dropped")
    stdout_dropped: int = Field(description="bytes of stdout dropped past max_output")
    stderr_dropped: int
    max_output: int


class FileContent(BaseModel):
    path: str
    size: int
    encoding: Literal["text", "base64"]
    content: str
    binary: bool = Field(
        description="text only: the file is not UTF-8 (bytes replaced); encoding=base64 gives its bytes"
    )


class Entry(BaseModel):
    name: str
    path: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: str = Field(description="permission bits in octal, e.g. 0644")
    mtime: float
    symlink_target: str | None = None


class FileList(BaseModel):
    path: str
    entries: list[Entry]


class InternetState(BaseModel):
    id: str
    internet: bool


class EgressState(BaseModel):
    id: str
    egress: list[str]


class SnapshotView(BaseModel):
    name: str
    source_id: str
    created_at: float
    backend: str
    size_bytes: int | None
    template: str = Field(default="default", description="its source's template (forks are cloned from it)")


class Destroyed(BaseModel):
    id: str
    destroyed: bool


def view(s: SandboxStatus) -> SandboxView:
    """What a status shows the model: the view's fields, as the status has them."""
    return SandboxView.model_validate({name: getattr(s, name) for name in SandboxView.model_fields})


def entry(e: EntryInfo) -> Entry:
    return Entry(
        name=e.name,
        path=e.path,
        type=e.type,
        size=e.size,
        mode=f"{e.mode:04o}",
        mtime=e.mtime,
        symlink_target=e.symlink_target,
    )


def brief(s: SandboxLike) -> SandboxBrief:
    return SandboxBrief(id=s.id, hostname=s.hostname, ip=s.ip, labels=s.labels, expires_at=s.expires_at)


def ok(model: BaseModel, text: str | None = None) -> CallToolResult:
    """A tool's answer: the structured result, and as text either ``text`` or the result's JSON."""
    data = model.model_dump(mode="json")
    shown = text if text is not None else json.dumps(data, ensure_ascii=False)
    return CallToolResult(content=[TextContent(type="text", text=shown)], structured_content=data)


# -- errors: the one place the runtime's errors become MCP tool errors -----------------------------------
def error_code(exc: SandboxError) -> str:
    """The tool error's code: the error's name (sandbox_rt.error_names), a file error's with its errno."""
    code = error_name(exc).code
    number = exc.errno if isinstance(exc, FileOperationError) else None
    if number is not None and number in errno.errorcode:
        return f"{code}:{errno.errorcode[number]}"
    return code


def tool_error(exc: SandboxError, max_output: int | None = None) -> CallToolResult:
    """The MCP tool error for a runtime error: ``<code> (<type>): <message>``; a command timeout
    adds the output the command printed until it was killed (at most ``max_output`` bytes each)."""
    text = f"{error_code(exc)} ({type(exc).__name__}): {exc}"
    if isinstance(exc, CommandTimeout):
        cap = max_output or DEFAULT_MAX_OUTPUT
        # the executor kept at most ``cap`` bytes of each stream and does not count the rest: a
        # stream that filled its cap may have been cut (how much is unknown)
        out, err = exc.stdout[:cap], exc.stderr[:cap]
        cut = [
            None if len(whole) == cap else len(whole) - len(kept)
            for whole, kept in ((exc.stdout, out), (exc.stderr, err))
        ]
        text += "\n" + _output_text(out, err, cap, cut[0], cut[1])
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


def internal_error() -> CallToolResult:
    text = "internal_error: the MCP server failed (see its log)"
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


def _decode(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _output_text(out: bytes, err: bytes, cap: int, out_dropped: int | None, err_dropped: int | None) -> str:
    """stdout and stderr for the model, each with a clear marker where bytes past ``cap`` were
    dropped (``None``: the stream reached the cap and may have been cut by an unknown amount)."""
    parts: list[str] = []
    limit = f"max_output={cap} bytes per stream"
    ask = "ask for a larger max_output to see more"
    for name, data, dropped in (("stdout", out, out_dropped), ("stderr", err, err_dropped)):
        if not data and not dropped:
            continue
        parts.append(f"--- {name} ---\n{_decode(data)}")
        if dropped is None:
            parts.append(f"[... {name} may be truncated: it filled {limit} ({ask})]")
        elif dropped:
            parts.append(f"[... {name} truncated: {dropped} more bytes dropped ({limit}; {ask})]")
    return "\n".join(parts) if parts else "(no output)"


def command_answer(r: ExecResult, cap: int) -> CallToolResult:
    result = CommandResult(
        exit_code=r.exit_code,
        stdout=_decode(r.stdout),
        stderr=_decode(r.stderr),
        duration_s=r.duration_s,
        truncated=r.truncated,
        stdout_dropped=r.stdout_dropped,
        stderr_dropped=r.stderr_dropped,
        max_output=cap,
    )
    head = f"exit code {r.exit_code} after {r.duration_s:.2f} s"
    body = _output_text(r.stdout, r.stderr, cap, r.stdout_dropped, r.stderr_dropped)
    return ok(result, f"{head}\n{body}")
