"""The OpenAPI 3.1 document of the HTTP control API (:mod:`sandbox_rt.http_api`), served at
``GET /openapi.json``. Kept as Python data beside the server so a unit test can check that every
route and body field the server implements is documented, and that its answers match the schemas.

Patterns end with ``$(?!\n)``, not ``$`` alone: JSON Schema means ECMA-262 regexes, whose ``$`` is
the end of the text, but Python's validators (jsonschema, hypothesis) use ``re.search``, whose ``$``
also matches before a final newline. The lookahead refuses ``"sbx-0123456789\n"`` in both.
The size and time limits quoted come from :data:`sandbox_rt.limits.HTTP_LIMITS`.
"""

from __future__ import annotations

import copy
from typing import Any

from . import __version__
from .caps import MAX_DISK_IOPS, MAX_DISK_MBPS, MAX_NET_MBPS
from .files import MAX_LIST_DEPTH
from .limits import DEFAULT_MAX_OUTPUT, HTTP_LIMITS
from .models import DEFAULT_CPUS, DEFAULT_DISK_GB, DEFAULT_MEMORY_MB, DEFAULT_PIDS_MAX, DEFAULT_TEMPLATE
from .validation import MAX_DISK_GB, MAX_PIDS_MAX, MAX_TTL_S, MIN_MEMORY_MB, MIN_PIDS_MAX, TEMPLATE_NAME

__all__ = ["openapi_document"]


def _exact(regex: str) -> str:
    """A pattern the whole string must match, in ECMA-262 and in Python's ``re.search`` alike."""
    return f"^{regex}$(?!\\n)"


def _size(n: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and not n % (1 << shift):
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


_SANDBOX_ID = {"type": "string", "pattern": _exact("sbx-[0-9a-f]{10}"), "examples": ["sbx-0123456789"]}
_LABELS = {
    "type": "object",
    "propertyNames": {"pattern": _exact("[A-Za-z0-9_./-]{1,63}")},
    "additionalProperties": {"type": "string", "maxLength": 256},
    "examples": [{"agent": "a1"}],
}
_NULLABLE_NUMBER = {"type": ["number", "null"]}
_NULLABLE_INT = {"type": ["integer", "null"]}
_SNAPSHOT_NAME = _exact("[A-Za-z][A-Za-z0-9_-]{1,39}")
_TEMPLATE = {
    "type": "string",
    "pattern": _exact(TEMPLATE_NAME.pattern),
    "description": f"A template name (GET /v1/templates; {DEFAULT_TEMPLATE!r}: the host's default).",
}
# per-sandbox caps on what sandboxes share (sandbox_rt/caps.py); 0: no cap
_CAP_TEXT = {
    "net_mbps": "Network bandwidth each way, Mbit/s (LXC: the runtime's SSH session is not counted).",
    "disk_mbps": "Disk bandwidth, MB/s, each of read and write, on the host's sandbox storage.",
    "disk_iops": "Disk operations per second, each of read and write, on the host's sandbox storage.",
}
_CAPS = {name: {"type": "integer", "minimum": 0, "description": text} for name, text in _CAP_TEXT.items()}
_CAPS_REQUEST = {
    name: {
        "type": ["integer", "null"],
        "minimum": 0,
        "maximum": top,
        "description": f"{_CAP_TEXT[name]} Default (absent or null): the host's default_{name}; 0: none.",
    }
    for name, top in (("net_mbps", MAX_NET_MBPS), ("disk_mbps", MAX_DISK_MBPS), ("disk_iops", MAX_DISK_IOPS))
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


# what any request can get before its route runs: bad framing, the limits of sandbox_rt.limits
_TRANSPORT_ERRORS = ("400", "408", "411", "413", "414", "431", "503")


def _errors(*codes: str) -> dict[str, Any]:
    every = sorted({*codes, *_TRANSPORT_ERRORS})
    return {code: {"$ref": f"#/components/responses/E{code}"} for code in every}


_L = HTTP_LIMITS
_ERROR_TEXT = {
    "400": "Invalid argument: malformed JSON, an unknown field, a wrong type or an out-of-range value "
    "(the message names the field), or a malformed or repeated Content-Length (connection closed).",
    "401": "Missing or wrong bearer token.",
    "403": "The file operation was refused inside the sandbox (EACCES/EPERM).",
    "404": "No such sandbox (or route, or file for the files endpoints).",
    "405": "The path exists but not with this method (see the Allow header).",
    "408": f"request_timeout: the request head (and, without a valid token, its body) did not arrive "
    f"within the head timeout ({_L.header_timeout_s:g} s by default), or an authenticated body stalled "
    f"for {_L.io_timeout_s:g} s. The connection is closed.",
    "409": "Conflict: the sandbox is not running, or a path is a directory / not a directory.",
    "411": "length_required: a body without Content-Length (chunked or any Transfer-Encoding is not "
    "accepted). The connection is closed.",
    "413": f"payload_too_large: the request body is larger than the limit (limit_bytes): "
    f"{_size(_L.max_body_bytes)} by default with a valid token, {_size(_L.max_unauth_body_bytes)} "
    "without one (public routes). The connection is closed without reading the body.",
    "414": f"uri_too_long: the request line is longer than {_size(_L.max_head_bytes)}. The connection "
    "is closed.",
    "431": f"request_header_fields_too_large: the request line and headers together are larger than "
    f"{_size(_L.max_head_bytes)}. The connection is closed.",
    "500": "Internal error (details only in the server's log).",
    "502": "The container engine or the sandbox's SSH connection failed.",
    "503": f"sandbox_not_ready: the sandbox did not become reachable in time; or server_busy: the "
    f"server has its maximum of open connections ({_L.max_connections} by default), answered at once "
    "with Retry-After and the connection closed (open connections are not affected).",
    "504": "The command ran past its timeout; its whole process group was killed. The error carries "
    "the output so far (stdout, stderr in the request's encoding) and timeout_s.",
    "507": "The sandbox's disk is full.",
}

# what an exec result says of output past max_output (JSON result and the SSE exit event)
_TRUNCATION: dict[str, Any] = {
    "truncated": {"type": "boolean", "description": "Output past max_output was dropped."},
    "stdout_dropped": {"type": "integer", "minimum": 0, "description": "stdout bytes dropped."},
    "stderr_dropped": {"type": "integer", "minimum": 0, "description": "stderr bytes dropped."},
}

_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": {
                        "type": "string",
                        "description": "Stable machine-readable code, e.g. invalid_argument, unauthorized, "
                        "not_found, route_not_found, method_not_allowed, conflict, payload_too_large, "
                        "command_timeout, file_not_found, file_permission_denied, file_conflict, "
                        "connection_lost, backend_error, backend_permission_denied, sandbox_not_ready, "
                        "insufficient_storage, internal_error, request_timeout, length_required, "
                        "uri_too_long, request_header_fields_too_large, server_busy.",
                    },
                    "message": {"type": "string", "description": "Human-readable; names the bad field."},
                    "type": {"type": "string", "description": "The runtime's exception class."},
                    "path": {"type": "string", "description": "File errors: the path in the sandbox."},
                    "timeout_s": {"type": "number", "description": "command_timeout: the timeout."},
                    "encoding": {"type": "string", "enum": ["utf-8", "base64"]},
                    "stdout": {"type": "string", "description": "command_timeout: output so far."},
                    "stderr": {"type": "string", "description": "command_timeout: output so far."},
                    "limit_bytes": {"type": "integer", "description": "payload_too_large: the limit."},
                    "limit": {"type": "integer", "description": "server_busy: the connection limit."},
                },
            }
        },
    },
    "Health": {
        "type": "object",
        "required": ["status", "version"],
        "properties": {"status": {"const": "ok"}, "version": {"type": "string"}},
    },
    "CreateSandboxRequest": {
        "type": "object",
        "additionalProperties": False,
        "description": "The arguments of sandbox_rt.Manager.create(); every field is optional.",
        "properties": {
            "hostname": {
                "type": ["string", "null"],
                "pattern": _exact("(?!-)[A-Za-z0-9-]{1,63}(?<!-)"),
                "description": "RFC 1123 host name (default: the sandbox id).",
            },
            "cpus": {
                "type": "number",
                "exclusiveMinimum": 0,
                "default": DEFAULT_CPUS,
                "description": "<= host cores",
            },
            "memory_mb": {"type": "integer", "minimum": MIN_MEMORY_MB, "default": DEFAULT_MEMORY_MB},
            "disk_gb": {"type": "integer", "minimum": 1, "maximum": MAX_DISK_GB, "default": DEFAULT_DISK_GB},
            "pids_max": {
                "type": "integer",
                "minimum": MIN_PIDS_MAX,
                "maximum": MAX_PIDS_MAX,
                "default": DEFAULT_PIDS_MAX,
            },
            "internet": {"type": "boolean", "default": False, "description": "HTTP/HTTPS egress allowed"},
            "labels": {**_LABELS, "type": ["object", "null"]},
            "ttl_s": {
                "type": ["integer", "null"],
                "minimum": 1,
                "maximum": 2592000,
                "description": "Lifetime in seconds; gc/the reaper destroy it afterwards "
                "(default: the host's default_ttl_s).",
            },
            "detached": {
                "type": "boolean",
                "default": True,
                "description": "True (the API's default): the sandbox lives by its TTL, not by the "
                "server process, so a server restart does not make it an orphan.",
            },
            "egress": {
                "type": ["array", "null"],
                "maxItems": 64,
                "items": {"type": "string"},
                "description": "Without internet, reach only these IPv4 addresses, networks and domain "
                "names (resolved by the host's DNS; lxc backend) on the internet ports.",
            },
            "from_snapshot": {
                "type": ["string", "null"],
                "pattern": _SNAPSHOT_NAME,
                "description": "Fork this snapshot (its files, a new identity) instead of the template; "
                "404 if there is none.",
            },
            "template": {
                **_TEMPLATE,
                "type": ["string", "null"],
                "description": "Clone this named template (GET /v1/templates; default: "
                f"{DEFAULT_TEMPLATE!r}); an unknown name is a 400 naming the known ones. Not with "
                "from_snapshot (a fork has its snapshot's template): 400.",
            },
            "root": {
                "type": "boolean",
                "default": False,
                "description": "Root on request: commands may run as the sandbox's root (exec with "
                "user=root), e.g. apt-get install through the egress list. The container stays "
                "unprivileged; never taken from the warm pool.",
            },
            **_CAPS_REQUEST,
        },
    },
    "ResourceUsage": {
        "type": "object",
        "description": "Read from the host's cgroups (disk: the sandbox's root filesystem); null "
        "where the engine cannot tell.",
        "properties": {
            "memory_bytes": _NULLABLE_INT,
            "memory_peak_bytes": _NULLABLE_INT,
            "cpu_time_s": _NULLABLE_NUMBER,
            "pids": _NULLABLE_INT,
            "disk_bytes": {
                **_NULLABLE_INT,
                "description": "LXC: bytes the sandbox wrote (its overlay delta); PVE: the rootfs "
                "usage PVE reports.",
            },
        },
    },
    "SandboxStatus": {
        "type": "object",
        "required": [
            "id",
            "state",
            "ip",
            "hostname",
            "cpus",
            "memory_mb",
            "disk_gb",
            "internet",
            "uptime_s",
            "usage",
            "labels",
            "expires_at",
            "egress",
        ],
        "properties": {
            "id": _SANDBOX_ID,
            "state": {"type": "string", "examples": ["running", "stopped"]},
            "ip": {"type": "string"},
            "hostname": {"type": "string"},
            "cpus": {"type": "number"},
            "memory_mb": {"type": "integer"},
            "disk_gb": {"type": "integer"},
            "internet": {"type": "boolean", "description": "Internet access is allowed now."},
            "uptime_s": _NULLABLE_NUMBER,
            "usage": _ref("ResourceUsage"),
            "labels": _LABELS,
            "expires_at": {**_NULLABLE_NUMBER, "description": "Unix time after which gc destroys it."},
            "egress": {"type": "array", "items": {"type": "string"}, "description": "The egress allow-list."},
            "template": _TEMPLATE,
            **_CAPS,
        },
    },
    "SandboxInfo": {
        "type": "object",
        "description": "A list entry: what the engine knows without connecting to the sandbox.",
        "required": [
            "id",
            "hostname",
            "ip",
            "backend",
            "created_at",
            "expires_at",
            "labels",
            "cpus",
            "memory_mb",
            "disk_gb",
            "pids_max",
        ],
        "properties": {
            "id": _SANDBOX_ID,
            "hostname": {"type": "string"},
            "ip": {"type": "string"},
            "backend": {"type": "string", "examples": ["lxc", "proxmox"]},
            "created_at": {"type": "number", "description": "Unix time"},
            "expires_at": _NULLABLE_NUMBER,
            "labels": _LABELS,
            "cpus": {"type": "number"},
            "memory_mb": {"type": "integer"},
            "disk_gb": {"type": "integer"},
            "pids_max": {"type": "integer"},
            "root": {"type": "boolean", "description": "Made with root=True (commands may run as root)."},
            "template": _TEMPLATE,
            **_CAPS,
        },
    },
    "SandboxList": {
        "type": "object",
        "required": ["sandboxes"],
        "properties": {"sandboxes": {"type": "array", "items": _ref("SandboxInfo")}},
    },
    "ExecRequest": {
        "type": "object",
        "additionalProperties": False,
        "required": ["command"],
        "properties": {
            "command": {
                "oneOf": [
                    {"type": "string", "minLength": 1, "description": "Run by bash as written."},
                    {
                        "type": "array",
                        "minItems": 1,
                        "items": {"type": "string"},
                        "description": "An exact argv, quoted word by word.",
                    },
                ]
            },
            "timeout": {
                "type": ["number", "null"],
                "exclusiveMinimum": 0,
                "description": "Seconds; on expiry the command's process group is killed (504 or an "
                "error event). Default: the host's command_timeout_s.",
            },
            "cwd": {"type": ["string", "null"], "description": "Absolute path in the sandbox."},
            "user": {
                "type": ["string", "null"],
                "enum": ["sandbox", "root", None],
                "description": "Who runs it: the sandbox user (default) or root, in a sandbox made with "
                "root=true (else 400).",
            },
            "env": {
                "type": ["object", "null"],
                "propertyNames": {"pattern": _exact("[A-Za-z_][A-Za-z0-9_]*")},
                "additionalProperties": {"type": "string"},
            },
            "stdin": {"type": ["string", "null"], "description": "Standard input as UTF-8 text."},
            "stdin_b64": {
                "type": ["string", "null"],
                "contentEncoding": "base64",
                "description": "Standard input as base64 bytes (at most one of stdin, stdin_b64).",
            },
            "encoding": {
                "type": "string",
                "enum": ["utf-8", "base64"],
                "default": "utf-8",
                "description": "How stdout/stderr are given back: UTF-8 text (undecodable bytes become "
                "U+FFFD) or base64 of the exact bytes. Applies to SSE data as well.",
            },
            "stream": {
                "type": "boolean",
                "description": "true: answer with server-sent events. Default: true if the Accept header "
                "names text/event-stream, else false.",
            },
            "max_output": {
                "type": ["integer", "null"],
                "minimum": 1,
                "description": "Bytes of each stream kept in the result; the rest is dropped and counted "
                f"(truncated, stdout_dropped, stderr_dropped). Default {DEFAULT_MAX_OUTPUT} (64 MiB). "
                "Server-sent events carry all output regardless.",
            },
        },
    },
    "ExecResult": {
        "type": "object",
        "required": [
            "command",
            "exit_code",
            "duration_s",
            "truncated",
            "stdout_dropped",
            "stderr_dropped",
            "encoding",
            "stdout",
            "stderr",
        ],
        "properties": {
            "command": {"type": "string", "description": "The command line as run."},
            "exit_code": {"type": "integer", "description": "Non-zero exits are results, not errors."},
            "duration_s": {"type": "number"},
            **_TRUNCATION,
            "encoding": {"type": "string", "enum": ["utf-8", "base64"]},
            "stdout": {"type": "string"},
            "stderr": {"type": "string"},
        },
    },
    "ExecOutputEvent": {
        "type": "object",
        "description": "data of an `event: stdout` / `event: stderr` server-sent event.",
        "required": ["data"],
        "properties": {"data": {"type": "string", "description": "A chunk in the request's encoding."}},
    },
    "ExecExitEvent": {
        "type": "object",
        "description": "data of the final `event: exit` server-sent event.",
        "required": ["command", "exit_code", "duration_s", "truncated", "stdout_dropped", "stderr_dropped"],
        "properties": {
            "command": {"type": "string"},
            "exit_code": {"type": "integer"},
            "duration_s": {"type": "number"},
            **_TRUNCATION,
        },
    },
    "ExecErrorEvent": {
        "type": "object",
        "description": "data of a final `event: error` server-sent event (instead of exit): the HTTP "
        "status the error would have had, and the Error body (without the output, already streamed).",
        "required": ["status", "error"],
        "properties": {
            "status": {"type": "integer"},
            "error": {"$ref": "#/components/schemas/Error/properties/error"},
        },
    },
    "ExtendRequest": {
        "type": "object",
        "additionalProperties": False,
        "required": ["ttl_s"],
        "properties": {
            "ttl_s": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_TTL_S,
                "description": "The sandbox lives this many seconds from now (E2B's set_timeout).",
            }
        },
    },
    "SnapshotList": {
        "type": "object",
        "required": ["snapshots"],
        "properties": {"snapshots": {"type": "array", "items": _ref("SnapshotInfo")}},
    },
    "SnapshotRequest": {
        "type": "object",
        "additionalProperties": False,
        "required": ["name"],
        "properties": {"name": {"type": "string", "pattern": _SNAPSHOT_NAME}},
    },
    "SnapshotInfo": {
        "type": "object",
        "required": ["name", "source_id", "created_at", "backend", "size_bytes"],
        "properties": {
            "name": {"type": "string"},
            "source_id": _SANDBOX_ID,
            "created_at": {"type": "number", "description": "Unix time"},
            "backend": {"type": "string"},
            "size_bytes": {**_NULLABLE_INT, "description": "LXC: bytes of the saved files; PVE: null"},
            "template": {**_TEMPLATE, "description": "The source's template: forks are cloned from it."},
        },
    },
    "TemplateList": {
        "type": "object",
        "required": ["templates"],
        "properties": {
            "templates": {
                "type": "array",
                "items": _TEMPLATE,
                "description": f"The names create takes, {DEFAULT_TEMPLATE!r} first.",
            }
        },
    },
    "InternetRequest": {
        "type": "object",
        "additionalProperties": False,
        "required": ["enabled"],
        "properties": {"enabled": {"type": "boolean"}},
    },
    "EgressRequest": {
        "type": "object",
        "additionalProperties": False,
        "required": ["egress"],
        "properties": {"egress": {"type": "array", "maxItems": 64, "items": {"type": "string"}}},
    },
    "EgressState": {
        "type": "object",
        "required": ["id", "egress"],
        "properties": {"id": _SANDBOX_ID, "egress": {"type": "array", "items": {"type": "string"}}},
    },
    "InternetState": {
        "type": "object",
        "required": ["id", "internet"],
        "properties": {"id": _SANDBOX_ID, "internet": {"type": "boolean"}},
    },
    "EntryInfo": {
        "type": "object",
        "description": "A file system entry of the sandbox, every field checked on the host.",
        "required": ["name", "path", "type", "size", "mode", "mtime", "symlink_target"],
        "properties": {
            "name": {"type": "string", "description": "One path component."},
            "path": {"type": "string"},
            "type": {"enum": ["file", "dir", "symlink", "other"]},
            "size": {"type": "integer", "minimum": 0},
            "mode": {"type": "integer", "minimum": 0, "maximum": 4095, "description": "Permission bits."},
            "mtime": {"type": "number"},
            "symlink_target": {"type": ["string", "null"]},
        },
    },
    "EntryList": {
        "type": "object",
        "required": ["entries"],
        "properties": {"entries": {"type": "array", "items": _ref("EntryInfo")}},
    },
    "MkdirRequest": {
        "type": "object",
        "additionalProperties": False,
        "required": ["path"],
        "properties": {
            "path": {"type": "string", "pattern": "^/"},
            "parents": {"type": "boolean", "default": True},
        },
    },
    "MkdirResult": {
        "type": "object",
        "required": ["path", "created"],
        "properties": {
            "path": {"type": "string"},
            "created": {"type": "boolean", "description": "False: it was there already."},
        },
    },
    "RenameRequest": {
        "type": "object",
        "additionalProperties": False,
        "required": ["src", "dst"],
        "properties": {name: {"type": "string", "pattern": "^/"} for name in ("src", "dst")},
    },
    "FileWritten": {
        "type": "object",
        "required": ["path", "size"],
        "properties": {"path": {"type": "string"}, "size": {"type": "integer", "minimum": 0}},
    },
}

def _json_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _flag_param(name: str, default: bool, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": {"type": "string", "enum": ["true", "false"], "default": str(default).lower()},
    }


_ID_PARAM = {"name": "id", "in": "path", "required": True, "schema": _SANDBOX_ID}
_PATH_PARAM = {
    "name": "path",
    "in": "query",
    "required": True,
    "description": "Absolute path of the file inside the sandbox.",
    "schema": {"type": "string", "pattern": "^/"},
}

_SSE_DESCRIPTION = """\
Server-sent events (with `"stream": true` or `Accept: text/event-stream`). Each chunk of output
is sent as soon as the command prints it:

    event: stdout
    data: {"data": "1\\n"}

    event: stderr
    data: {"data": "warning\\n"}

    event: exit
    data: {"command": "...", "exit_code": 0, "duration_s": 3.02}

`data` is a JSON object on one line: ExecOutputEvent for stdout/stderr (text or base64 as the
request's `encoding` says), ExecExitEvent for the last event. If the command cannot finish
(timeout, lost connection) the last event is `event: error` with an ExecErrorEvent instead.
Errors found before the command starts (bad body, unknown sandbox) are ordinary JSON errors.
"""

_PATHS: dict[str, Any] = {
    "/healthz": {
        "get": {
            "operationId": "health",
            "summary": "Liveness probe (no authentication)",
            "security": [],
            "responses": {"200": _json(_ref("Health"), "The server is up."), **_errors()},
        }
    },
    "/openapi.json": {
        "get": {
            "operationId": "openapi",
            "summary": "This OpenAPI document (no authentication)",
            "security": [],
            "responses": {"200": _json({"type": "object"}, "The OpenAPI 3.1 document."), **_errors()},
        }
    },
    "/v1/templates": {
        "get": {
            "operationId": "listTemplates",
            "summary": "The template names a create may use (the host contract's; default first)",
            "responses": {"200": _json(_ref("TemplateList"), "The names."), **_errors("401")},
        }
    },
    "/v1/sandboxes": {
        "post": {
            "operationId": "createSandbox",
            "summary": "Create a sandbox (clone, limits, start, SSH-ready; all or nothing)",
            "requestBody": {
                "required": False,
                "content": {"application/json": {"schema": _ref("CreateSandboxRequest")}},
            },
            "responses": {
                "201": {
                    **_json(_ref("SandboxStatus"), "Created and running."),
                    "headers": {
                        "Location": {"schema": {"type": "string"}, "description": "/v1/sandboxes/{id}"}
                    },
                },
                **_errors("400", "401", "413", "500", "502", "503"),
            },
        },
        "get": {
            "operationId": "listSandboxes",
            "summary": "List sandboxes, optionally only those with all the given labels",
            "parameters": [
                {
                    "name": "label",
                    "in": "query",
                    "required": False,
                    "description": "KEY=VALUE; repeat for several (all must match).",
                    "style": "form",
                    "explode": True,
                    "schema": {"type": "array", "items": {"type": "string", "pattern": "^[^=]+="}},
                }
            ],
            "responses": {
                "200": _json(_ref("SandboxList"), "The sandboxes."),
                **_errors("400", "401", "502"),
            },
        },
    },
    "/v1/sandboxes/{id}": {
        "parameters": [_ID_PARAM],
        "get": {
            "operationId": "getSandbox",
            "summary": "State, limits, address, uptime, resource usage and internet access",
            "responses": {
                "200": _json(_ref("SandboxStatus"), "The sandbox's status."),
                **_errors("400", "401", "404", "409", "502", "503"),
            },
        },
        "delete": {
            "operationId": "deleteSandbox",
            "summary": "Destroy the sandbox and everything it holds",
            "responses": {"204": {"description": "Destroyed."}, **_errors("400", "401", "404", "502")},
        },
    },
    "/v1/sandboxes/{id}/exec": {
        "parameters": [_ID_PARAM],
        "post": {
            "operationId": "execCommand",
            "summary": "Run a command as the sandbox user; JSON result or server-sent events",
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref("ExecRequest")}},
            },
            "responses": {
                "200": {
                    "description": "The command ran (any exit code).",
                    "content": {
                        "application/json": {"schema": _ref("ExecResult")},
                        "text/event-stream": {"schema": {"type": "string", "description": _SSE_DESCRIPTION}},
                    },
                },
                **_errors("400", "401", "404", "409", "413", "502", "503", "504"),
            },
        },
    },
    "/v1/sandboxes/{id}/files": {
        "parameters": [_ID_PARAM],
        "get": {
            "operationId": "readFile",
            "summary": "Read a file (raw bytes)",
            "parameters": [_PATH_PARAM],
            "responses": {
                "200": {
                    "description": "The file's exact bytes (a regular file of at most 256 MiB; larger "
                    "is 413, a device, FIFO or socket 409).",
                    "content": {"application/octet-stream": {"schema": {}}},
                },
                **_errors("400", "401", "403", "404", "409", "413", "502"),
            },
        },
        "put": {
            "operationId": "writeFile",
            "summary": "Write a file (raw body; parent directories are created)",
            "parameters": [
                _PATH_PARAM,
                {
                    "name": "mode",
                    "in": "query",
                    "required": False,
                    "description": "Octal permissions, e.g. 644 or 0755.",
                    "schema": {"type": "string", "pattern": _exact("0?[0-7]{3,4}")},
                },
            ],
            "requestBody": {"required": True, "content": {"application/octet-stream": {"schema": {}}}},
            "responses": {
                "200": _json(_ref("FileWritten"), "Written."),
                **_errors("400", "401", "403", "404", "409", "411", "413", "502", "507"),
            },
        },
        "delete": {
            "operationId": "removeFile",
            "summary": "Remove a file, a symlink (not its target) or a directory; absent is fine",
            "parameters": [
                _PATH_PARAM,
                _flag_param("recursive", False, "Remove a directory with everything in it."),
            ],
            "responses": {
                "204": {"description": "Gone."},
                **_errors("400", "401", "403", "404", "409", "502"),
            },
        },
    },
    "/v1/sandboxes/{id}/files/list": {
        "parameters": [_ID_PARAM],
        "get": {
            "operationId": "listFiles",
            "summary": "A directory's entries, depth levels deep, sorted by path (symlinks not followed)",
            "parameters": [
                {**_PATH_PARAM, "description": "Absolute path of the directory."},
                {
                    "name": "depth",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIST_DEPTH, "default": 1},
                },
            ],
            "responses": {
                "200": _json(_ref("EntryList"), "The entries."),
                **_errors("400", "401", "403", "404", "409", "413", "502"),
            },
        },
    },
    "/v1/sandboxes/{id}/files/stat": {
        "parameters": [_ID_PARAM],
        "get": {
            "operationId": "statFile",
            "summary": "One entry",
            "parameters": [_PATH_PARAM, _flag_param("follow_symlinks", True, "Report a link's target.")],
            "responses": {
                "200": _json(_ref("EntryInfo"), "The entry."),
                **_errors("400", "401", "403", "404", "409", "502"),
            },
        },
    },
    "/v1/sandboxes/{id}/files/mkdir": {
        "parameters": [_ID_PARAM],
        "post": {
            "operationId": "makeDirectory",
            "summary": "Make a directory (and its parents unless parents=false)",
            "requestBody": _json_body(_ref("MkdirRequest")),
            "responses": {
                "200": _json(_ref("MkdirResult"), "There now."),
                **_errors("400", "401", "403", "404", "409", "502", "507"),
            },
        },
    },
    "/v1/sandboxes/{id}/files/rename": {
        "parameters": [_ID_PARAM],
        "post": {
            "operationId": "renameFile",
            "summary": "Move src to dst (a file at dst is replaced)",
            "requestBody": _json_body(_ref("RenameRequest")),
            "responses": {
                "200": _json(_ref("EntryInfo"), "The entry at dst."),
                **_errors("400", "401", "403", "404", "409", "502"),
            },
        },
    },
    "/v1/sandboxes/{id}/internet": {
        "parameters": [_ID_PARAM],
        "post": {
            "operationId": "setInternet",
            "summary": "Allow or forbid the sandbox's HTTP/HTTPS traffic to the internet",
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref("InternetRequest")}},
            },
            "responses": {
                "200": _json(_ref("InternetState"), "Applied."),
                **_errors("400", "401", "404", "409", "502"),
            },
        },
    },
    "/v1/sandboxes/{id}/egress": {
        "parameters": [_ID_PARAM],
        "put": {
            "operationId": "setEgress",
            "summary": "Replace the egress allow-list (reachable while internet is off); [] closes it",
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref("EgressRequest")}},
            },
            "responses": {
                "200": _json(_ref("EgressState"), "Applied; the list as normalised."),
                **_errors("400", "401", "404", "409", "502"),
            },
        },
    },
    "/v1/sandboxes/{id}/snapshots": {
        "parameters": [_ID_PARAM],
        "post": {
            "operationId": "snapshotSandbox",
            "summary": "Save the sandbox's files as a named snapshot; create with from_snapshot forks it",
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref("SnapshotRequest")}},
            },
            "responses": {
                "201": _json(_ref("SnapshotInfo"), "Saved."),
                **_errors("400", "401", "404", "409", "502"),
            },
        },
    },
    "/v1/sandboxes/{id}/extend": {
        "parameters": [_ID_PARAM],
        "post": {
            "operationId": "extendSandbox",
            "summary": "Let the sandbox live ttl_s seconds from now",
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref("ExtendRequest")}},
            },
            "responses": {
                "200": _json(_ref("SandboxStatus"), "Its status with the new expires_at."),
                **_errors("400", "401", "404", "409", "502"),
            },
        },
    },
    "/v1/snapshots": {
        "get": {
            "operationId": "listSnapshots",
            "summary": "The host's snapshots (LXC: they outlive their source; PVE: they go with it)",
            "responses": {"200": _json(_ref("SnapshotList"), "The snapshots."), **_errors("401", "502")},
        }
    },
    "/v1/snapshots/{name}": {
        "parameters": [
            {
                "name": "name",
                "in": "path",
                "required": True,
                "schema": {"type": "string", "pattern": _SNAPSHOT_NAME},
            }
        ],
        "delete": {
            "operationId": "deleteSnapshot",
            "summary": "Delete a snapshot (forks made from it are not affected)",
            "responses": {
                "204": {"description": "Deleted."},
                **_errors("400", "401", "404", "502"),
            },
        },
    },
}

_DOCUMENT: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "sandbox_rt control API",
        "version": __version__,
        "summary": "Ephemeral, hardened, network-isolated Linux sandboxes for LLM agents",
        "description": "See docs/http-api.md. All /v1 routes need `Authorization: Bearer <token>`. "
        f"Limits (defaults): a request head of at most {_size(_L.max_head_bytes)} arriving within "
        f"{_L.header_timeout_s:g} s; a body of at most {_size(_L.max_body_bytes)} with a valid token, "
        f"{_size(_L.max_unauth_body_bytes)} without; {_L.max_connections} open connections; a "
        f"keep-alive connection idle for {_L.idle_timeout_s:g} s is closed. A running command (JSON or "
        "server-sent events) is bounded by its own timeout only.",
        "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
    },
    "servers": [{"url": "http://127.0.0.1:8787", "description": "the default bind address"}],
    "security": [{"bearerAuth": []}],
    "paths": _PATHS,
    "components": {
        "schemas": _SCHEMAS,
        "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
        "responses": {
            **{f"E{code}": _json(_ref("Error"), text) for code, text in _ERROR_TEXT.items()},
            "E503": {
                **_json(_ref("Error"), _ERROR_TEXT["503"]),
                "headers": {
                    "Retry-After": {
                        "schema": {"type": "integer"},
                        "description": "server_busy: seconds to wait before connecting again.",
                    }
                },
            },
        },
    },
}


def openapi_document() -> dict[str, Any]:
    """A fresh copy of the OpenAPI 3.1 document of the HTTP API."""
    return copy.deepcopy(_DOCUMENT)
