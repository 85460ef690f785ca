"""The request and answer bodies of the native HTTP API, in one place: the routes validate with
them and the OpenAPI document is generated from them. Limits are quoted from
:mod:`sandbox_rt.validation`, :mod:`sandbox_rt.caps` and :mod:`sandbox_rt.output_limits`, which the
runtime enforces. Answers that are a runtime record as it is (status, snapshot, file entry) use the
runtime's dataclasses from :mod:`sandbox_rt.models` directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model

from ..models import DEFAULT_TEMPLATE, EntryInfo, SnapshotInfo, VolumeInfo, VolumeMount
from ..options import (
    JSON_TYPES,
    MAX_EGRESS_ENTRIES,
    MAX_TTL_S,
    Option,
    all_options,
    door_options,
    mounts_from_wire,
)
from ..output_limits import DEFAULT_MAX_OUTPUT
from ..validation import NODE_NAME, TEMPLATE_NAME
from ..volumes.checks import ABSOLUTE_PATH, MAX_MOUNTS, MAX_PATH, MOUNT_PATH, RELATIVE_PATH, VOLUME_NAME
from .kinds import Kind, exact

SANDBOX_ID_PATTERN = exact("sbx-[0-9a-f]{10}")
TEMPLATE_PATTERN = exact(TEMPLATE_NAME.pattern)
LABEL_KEY_PATTERN = exact("[A-Za-z0-9_./-]{1,63}")
ENV_NAME_PATTERN = exact("[A-Za-z_][A-Za-z0-9_]*")
HOSTNAME_PATTERN = exact("(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
# a letter, then 1-39 of letters, digits, _ and -; not PVE's reserved "current" / "vzdump", any case
SNAPSHOT_NAME_PATTERN = exact(
    "(?!(?:[Cc][Uu][Rr][Rr][Ee][Nn][Tt]|[Vv][Zz][Dd][Uu][Mm][Pp])$)[A-Za-z][A-Za-z0-9_-]{1,39}"
)
# "the end of the text" without $, for patterns that do not end a whole-string match (a trailing
# newline is fine in them): ECMA-262 and Python agree on (?![\s\S])
_END = "(?![\\s\\S])"
NO_NUL_PATTERN = "^[^\\x00]*" + _END  # the runtime refuses NUL in what reaches a shell or a path
ABSOLUTE_PATH_PATTERN = "^/[^\\x00]*" + _END
# a command that is not only ASCII blanks (sandbox_rt.execution.COMMAND_BLANKS) and has no NUL
COMMAND_PATTERN = "^(?=[\\s\\S]*[^ \\t\\n\\r\\f\\v])[^\\x00]*" + _END
VOLUME_NAME_PATTERN = exact(VOLUME_NAME.pattern)
MOUNT_PATH_PATTERN = exact(MOUNT_PATH.pattern)
BASE64_PATTERN = exact("(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")


def _ipv4_networks() -> str:
    """An IPv4 address, or a network written with its host bits zero and a prefix of 1-32: what
    :func:`sandbox_rt.validation.egress_entry` takes, as one regex (one branch per prefix length)."""
    octet = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
    branches = [f"(?:{octet}\\.){{3}}{octet}"]
    for prefix in range(1, 33):
        free, bits = divmod(prefix, 8)
        parts = [octet] * free
        if free < 4:
            step = 1 << (8 - bits)
            parts.append("(?:" + "|".join(str(v) for v in range(0, 256, step)) + ")" if bits else "0")
            parts += ["0"] * (3 - free)
        branches.append("\\.".join(parts) + f"/{prefix}")
    return "(?:" + "|".join(branches) + ")"


# a domain name (its subdomains too; "*." in front and a final "." are allowed), as egress_entry
_DOMAIN_NAME = (
    "(?:\\*\\.)?(?=[^\\n]{1,253}\\.?$)(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\\.)+"
    "[A-Za-z][A-Za-z0-9-]{0,61}[A-Za-z0-9]\\.?"
)
EGRESS_ENTRY_PATTERN = exact(f"(?:{_ipv4_networks()}|{_DOMAIN_NAME})")
_EGRESS_ITEMS = {"type": "string", "maxLength": 255, "pattern": EGRESS_ENTRY_PATTERN}
COMMAND_DOC: dict[str, Any] = {
    "oneOf": [
        {
            "type": "string",
            "minLength": 1,
            "pattern": COMMAND_PATTERN,
            "description": "Run by bash as written.",
        },
        {
            "type": "array",
            "minItems": 1,
            "items": {"type": "string", "pattern": NO_NUL_PATTERN},
            "description": "An exact argv, quoted word by word.",
        },
    ]
}
ENV_DOC: dict[str, Any] = {
    "propertyNames": {"pattern": ENV_NAME_PATTERN},
    "additionalProperties": {"type": "string", "pattern": NO_NUL_PATTERN},
}


def not_both(a: str, b: str) -> dict[str, Any]:
    """JSON Schema: fields ``a`` and ``b`` are not both given (as non-null strings)."""
    return {"not": {"required": [a, b], "properties": {a: {"type": "string"}, b: {"type": "string"}}}}


_LABELS_DOC = {
    "propertyNames": {"pattern": LABEL_KEY_PATTERN},
    "additionalProperties": {"type": "string", "maxLength": 256, "pattern": NO_NUL_PATTERN},
    "examples": [{"agent": "a1"}],
}
# an answer's patterns are documentation (the server made the value): no regex engine runs them
_SANDBOX_ID: Any = Field(json_schema_extra={"pattern": SANDBOX_ID_PATTERN, "examples": ["sbx-0123456789"]})


class RequestBody(BaseModel):
    """A JSON object body: unknown fields are refused, every field is checked for its JSON kind."""

    model_config = ConfigDict(extra="forbid")


class VolumeSource(RequestBody):
    """What is mounted at one mount path: a named volume or an allowed host directory."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"oneOf": [{"required": ["volume"]}, {"required": ["host_path"]}]},
    )

    volume: Annotated[Any, Kind("string", pattern=VOLUME_NAME_PATTERN)] = Field(
        default=None, description="A named volume (GET /v1/volumes); 404 if there is none."
    )
    host_path: Annotated[Any, Kind("string", maxLength=MAX_PATH, pattern=exact(ABSOLUTE_PATH.pattern))] = (
        Field(
            default=None,
            description="A host directory under one the host allows (volume_host_dirs); 403 outside them "
            "or through a symbolic link, 404 if it is not there.",
        )
    )
    sub_path: Annotated[
        Any, Kind("string", nullable=True, maxLength=MAX_PATH, pattern=exact(RELATIVE_PATH.pattern))
    ] = Field(default=None, description="Mount this directory inside the source instead (made in a volume).")
    read_only: Annotated[Any, Kind("boolean")] = Field(
        default=False,
        description="Refuse every write, root's too; no other volume may be mounted inside it (400).",
    )


# The JSON Schema of each syntax a create option's strings have (sandbox_rt.options declares which)
_SYNTAX_DOCS: dict[str, dict[str, Any]] = {
    "host_name": {"pattern": HOSTNAME_PATTERN},
    "label_map": _LABELS_DOC,
    "destinations": {"items": _EGRESS_ITEMS},
    "snapshot_name": {"pattern": SNAPSHOT_NAME_PATTERN},
    "template_name": {"pattern": TEMPLATE_PATTERN},
    "node_name": {"pattern": exact(NODE_NAME.pattern)},
}
# what the server's policy (sandbox_rt.policy.DoorPolicy) says of an option it governs
_POLICY_TEXT = {
    "cap": "0 or more than the host's default is 403 policy_denied unless the server runs with "
    "--allow-uncapped.",
    "root": "403 policy_denied unless the server runs with --allow-root.",
}
_BOUNDS = {
    "minimum": "minimum",
    "maximum": "maximum",
    "exclusive_minimum": "exclusiveMinimum",
    "max_items": "maxItems",
}
_MOUNTS_DOC: dict[str, Any] = {
    "maxProperties": MAX_MOUNTS,
    "propertyNames": {"maxLength": MAX_PATH, "pattern": MOUNT_PATH_PATTERN},
}


def _mounts(wire: dict[str, VolumeSource] | None) -> list[VolumeMount] | None:
    return None if wire is None else mounts_from_wire({p: src.model_dump() for p, src in wire.items()})


def _create_field(opt: Option) -> tuple[Any, Any]:
    """(type, FieldInfo) of one create option in the request body, from its declaration."""
    text = " ".join(t for t in (opt.doc, _POLICY_TEXT.get(opt.policy or "")) if t) or None
    field = Field(default=opt.default_at("http"), description=text)
    if opt.kind == "mounts":
        mounts = Annotated[dict[str, VolumeSource] | None, AfterValidator(_mounts)]
        return mounts, Field(default=None, description=text, json_schema_extra=_MOUNTS_DOC)
    bounds = {key: getattr(opt, attr) for attr, key in _BOUNDS.items() if getattr(opt, attr) is not None}
    kind = Kind(opt.kind, nullable=opt.nullable, **bounds, **_SYNTAX_DOCS.get(opt.syntax or "", {}))
    return Annotated[Any, kind], field


def create_request_model(options: Sequence[Option]) -> type[RequestBody]:
    """The body of ``POST /v1/sandboxes``: every create option the HTTP API takes, each optional,
    checked for its JSON kind and documented with its bounds (the runtime checks the values)."""
    exclusions: list[Any] = [not_both(other, o.name) for o in options for other in o.excludes]
    config = ConfigDict(
        extra="forbid",
        json_schema_extra=exclusions[0]
        if len(exclusions) == 1
        else {"allOf": exclusions}
        if exclusions
        else None,
    )
    base = type("CreateBody", (RequestBody,), {"model_config": config, "__module__": __name__})
    fields: dict[str, Any] = {opt.name: _create_field(opt) for opt in options}
    return create_model(
        "CreateSandboxRequest",
        __base__=base,
        __doc__="The arguments of sandbox_rt.Manager.create(); every field is optional.",
        __module__=__name__,
        **fields,
    )


CreateSandboxRequest: type[RequestBody] = create_request_model(door_options("http"))


class ExecRequest(RequestBody):
    model_config = ConfigDict(extra="forbid", json_schema_extra=not_both("stdin", "stdin_b64"))

    command: Annotated[Any, Kind("command", **COMMAND_DOC)]
    timeout: Annotated[Any, Kind("number", nullable=True, exclusiveMinimum=0)] = Field(
        default=None,
        description="Seconds; on expiry the command's process group is killed (504 or an error "
        "event). Default: the host's command_timeout_s.",
    )
    cwd: Annotated[Any, Kind("string", nullable=True, pattern=ABSOLUTE_PATH_PATTERN)] = Field(
        default=None, description="Absolute path in the sandbox."
    )
    user: Annotated[Any, Kind("string", nullable=True, enum=["sandbox", "root", None])] = Field(
        default=None,
        description="Who runs it: the sandbox user (default) or root, in a sandbox made with "
        "root=true (else 400).",
    )
    env: Annotated[Any, Kind("string_map", nullable=True, **ENV_DOC)] = None
    stdin: Annotated[Any, Kind("string", nullable=True)] = Field(
        default=None, description="Standard input as UTF-8 text."
    )
    stdin_b64: Annotated[
        Any, Kind("string", nullable=True, contentEncoding="base64", pattern=BASE64_PATTERN)
    ] = Field(default=None, description="Standard input as base64 bytes (at most one of stdin, stdin_b64).")
    encoding: Annotated[Any, Kind("string", enum=["utf-8", "base64"])] = Field(
        default="utf-8",
        description="How stdout/stderr are given back: UTF-8 text (undecodable bytes become U+FFFD) "
        "or base64 of the exact bytes. Applies to SSE data as well.",
    )
    stream: Annotated[Any, Kind("boolean")] = Field(
        default=None,
        description="true: answer with server-sent events. Default: true if the Accept header names "
        "text/event-stream, else false.",
    )
    max_output: Annotated[Any, Kind("integer", nullable=True, minimum=1)] = Field(
        default=None,
        description="Bytes of each stream kept in the result; the rest is dropped and counted "
        f"(truncated, stdout_dropped, stderr_dropped). Default {DEFAULT_MAX_OUTPUT} (64 MiB). "
        "Server-sent events carry all output regardless.",
    )


class InternetRequest(RequestBody):
    enabled: Annotated[Any, Kind("boolean")]


class EgressRequest(RequestBody):
    egress: Annotated[Any, Kind("string_list", maxItems=MAX_EGRESS_ENTRIES, items=_EGRESS_ITEMS)]


class SnapshotRequest(RequestBody):
    name: Annotated[Any, Kind("string", pattern=SNAPSHOT_NAME_PATTERN)]


class ExtendRequest(RequestBody):
    ttl_s: Annotated[Any, Kind("integer", minimum=1, maximum=MAX_TTL_S)] = Field(
        description="The sandbox lives this many seconds from now (E2B's set_timeout)."
    )


class MkdirRequest(RequestBody):
    path: Annotated[Any, Kind("string", pattern=ABSOLUTE_PATH_PATTERN)]
    parents: Annotated[Any, Kind("boolean")] = True


class RenameRequest(RequestBody):
    src: Annotated[Any, Kind("string", pattern=ABSOLUTE_PATH_PATTERN)]
    dst: Annotated[Any, Kind("string", pattern=ABSOLUTE_PATH_PATTERN)]


# -- answers -----------------------------------------------------------------------------------------
class Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorDetail(BaseModel):
    code: str = Field(
        description="Stable machine-readable code, e.g. invalid_argument, unauthorized, not_found, "
        "route_not_found, method_not_allowed, conflict, payload_too_large, command_timeout, "
        "file_not_found, file_permission_denied, file_conflict, file_name_too_long, connection_lost, "
        "backend_error, backend_permission_denied, sandbox_not_ready, insufficient_storage, internal_error, "
        "request_timeout, length_required, uri_too_long, request_header_fields_too_large, server_busy."
    )
    message: str = Field(description="Human-readable; names the bad field.")
    type: str | None = Field(default=None, description="The runtime's exception class.")
    path: str | None = Field(default=None, description="File errors: the path in the sandbox.")
    timeout_s: float | None = Field(default=None, description="command_timeout: the timeout.")
    encoding: Literal["utf-8", "base64"] | None = None
    stdout: str | None = Field(default=None, description="command_timeout: output so far.")
    stderr: str | None = Field(default=None, description="command_timeout: output so far.")
    limit_bytes: int | None = Field(default=None, description="payload_too_large: the limit.")
    limit: int | None = Field(default=None, description="server_busy: the connection limit.")


class Error(BaseModel):
    error: ErrorDetail


class Health(Answer):
    status: Literal["ok"]
    version: str


class TemplateList(Answer):
    templates: list[str] = Field(description=f"The names create takes, {DEFAULT_TEMPLATE!r} first.")


class _ListedRecord(Answer):
    id: str = _SANDBOX_ID
    hostname: str
    ip: str
    backend: str = Field(examples=["lxc", "proxmox"])
    created_at: float = Field(description="Unix time")
    expires_at: float | None


def list_entry_model(options: Sequence[Option]) -> type[BaseModel]:
    """A list entry: the record's identity, and the create options it lists (their declaration's
    ``listed``), as the spec holds them."""
    fields: dict[str, Any] = {
        o.name: (JSON_TYPES[o.kind], Field(description=o.listed_doc)) for o in options if o.listed
    }
    return create_model(
        "SandboxInfo",
        __base__=_ListedRecord,
        __doc__="A list entry: what the engine knows without connecting to the sandbox.",
        __module__=__name__,
        **fields,
    )


SandboxInfo = list_entry_model(all_options())  # typed as a BaseModel: its fields are generated
_ENTRIES: Any = list[SandboxInfo]  # type: ignore[valid-type]
SandboxList: type[BaseModel] = create_model("SandboxList", __base__=Answer, sandboxes=(_ENTRIES, ...))


class _ExecSummary(Answer):
    command: str = Field(description="The command line as run.")
    exit_code: int = Field(description="Non-zero exits are results, not errors.")
    duration_s: float
    truncated: bool = Field(description="Output past max_output was dropped.")
    stdout_dropped: int = Field(ge=0, description="stdout bytes dropped.")
    stderr_dropped: int = Field(ge=0, description="stderr bytes dropped.")


class ExecResult(_ExecSummary):
    encoding: Literal["utf-8", "base64"]
    stdout: str
    stderr: str


class ExecExitEvent(_ExecSummary):
    """data of the final `event: exit` server-sent event."""


class ExecOutputEvent(Answer):
    """data of an `event: stdout` / `event: stderr` server-sent event."""

    data: str = Field(description="A chunk in the request's encoding.")


class ExecErrorEvent(Answer):
    """data of a final `event: error` server-sent event (instead of exit): the HTTP status the error
    would have had, and the Error body (without the output, already streamed)."""

    status: int
    error: ErrorDetail


class InternetState(Answer):
    id: str = _SANDBOX_ID
    internet: bool


class EgressState(Answer):
    id: str = _SANDBOX_ID
    egress: list[str]


class SnapshotList(Answer):
    snapshots: list[SnapshotInfo]


class VolumeList(Answer):
    volumes: list[VolumeInfo]


class CreateVolumeRequest(RequestBody):
    name: Annotated[Any, Kind("string", pattern=VOLUME_NAME_PATTERN)] = Field(
        description="A DNS label; 409 if a volume has it."
    )


class EntryList(Answer):
    entries: list[EntryInfo]


class MkdirResult(Answer):
    path: str
    created: bool = Field(description="False: it was there already.")


class FileWritten(Answer):
    path: str
    size: int = Field(ge=0)


SSE_EVENTS: dict[str, type[BaseModel]] = {
    "stdout": ExecOutputEvent,
    "stderr": ExecOutputEvent,
    "exit": ExecExitEvent,
    "error": ExecErrorEvent,
}
