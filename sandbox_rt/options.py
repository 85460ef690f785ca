"""The create options, declared once (issue 36): every front door derives from :class:`CreateOptions`.

Each option is a key of the ``TypedDict`` :class:`CreateOptions` (its name and Python type) and an
:class:`Option` in its ``Annotated`` metadata (its JSON kind, default, bounds, help, which doors take
it, which policy governs it). From this one declaration come:

- the Python signatures: ``Manager.create``, ``AsyncManager.create``, ``remote.Client.create`` and
  ``remote.AsyncClient.create`` take ``**options: Unpack[CreateOptions]`` (typed for mypy and IDEs);
- the checks: :func:`sandbox_rt.validation.check_create` (and ``make_spec``) validate every option
  by its kind, bounds and syntax, in the one layer every door passes through (``Manager.create``);
- the native HTTP API's request model and its OpenAPI schema (:mod:`sandbox_rt.web.schemas`), the
  CLI's ``run``/``create`` flags (:mod:`sandbox_rt.cli`), the MCP tool ``create_sandbox``'s
  parameters (:mod:`sandbox_rt.mcp.server`), and which options the OpenSandbox dialect may set;
- what the agent-facing doors' policy governs (:class:`sandbox_rt.policy.DoorPolicy`).

A new option is one more key here (and, if the runtime keeps it, a :class:`SandboxSpec` field and
the backend code that enforces it); no front door lists the options.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, TypedDict

from .caps import (
    DEFAULT_DISK_IOPS,
    DEFAULT_DISK_MBPS,
    DEFAULT_NET_MBPS,
    MAX_DISK_IOPS,
    MAX_DISK_MBPS,
    MAX_NET_MBPS,
)
from .errors import ConfigError
from .models import (
    DEFAULT_CPUS,
    DEFAULT_DISK_GB,
    DEFAULT_MEMORY_MB,
    DEFAULT_PIDS_MAX,
    DEFAULT_TEMPLATE,
    SandboxSpec,
    VolumeMount,
)

__all__ = [
    "CREATE_NOTES",
    "DOORS",
    "JSON_TYPES",
    "MAX_DISK_GB",
    "MAX_EGRESS_ENTRIES",
    "MAX_MEMORY_MB",
    "MAX_PIDS_MAX",
    "MAX_TTL_S",
    "MIN_MEMORY_MB",
    "MIN_PIDS_MAX",
    "CreateOptions",
    "Door",
    "Option",
    "SpecOptions",
    "all_options",
    "door_options",
    "mounts_from_wire",
    "mounts_to_wire",
    "named",
    "option",
    "take",
]

# -- bounds (the runtime enforces them: sandbox_rt.validation; the doors quote them) -----------------
MIN_MEMORY_MB = 64
MAX_MEMORY_MB = 1 << 30  # 1 PiB: larger than any host, small enough for every engine's field
MAX_DISK_GB = 4096
MIN_PIDS_MAX = 16
MAX_PIDS_MAX = 1 << 22  # the kernel's largest pid_max
MAX_TTL_S = 30 * 24 * 3600
MAX_EGRESS_ENTRIES = 64

# The front doors. ``python``: Manager and AsyncManager (the operator's own code); ``http``: the native
# HTTP API and the remote clients, which reach it; ``cli``: ``sandbox-rt run``/``create``; ``mcp``: the
# MCP server's create_sandbox; ``opensandbox``: the OpenSandbox dialect (its mapping sets them).
Door = Literal["python", "http", "cli", "mcp", "opensandbox"]
DOORS: tuple[Door, ...] = ("python", "http", "cli", "mcp", "opensandbox")
# the JSON kind of a value (sandbox_rt.web.kinds checks a request's JSON against it); "mounts": the
# volumes map (mount path -> source)
Kind = Literal["string", "number", "integer", "boolean", "string_map", "string_list", "mounts"]
# the Python type of a JSON value of each kind (what the MCP SDK and the answer models check)
JSON_TYPES: dict[str, Any] = {
    "string": str,
    "number": float,
    "integer": int,
    "boolean": bool,
    "string_list": list[str],
    "string_map": dict[str, str],
}
# what the doors agents use check beyond the value (sandbox_rt.policy): root, and the caps
Policy = Literal["root", "cap"]
# a bound only the host knows (the served OpenAPI document makes it exact; make_spec checks cores)
HostBound = Literal["cores", "templates", "nodes", "pids_budget"]


@dataclasses.dataclass(frozen=True)
class Option:
    """What one create option is besides its name and Python type (its :class:`CreateOptions` key).

    ``default``: what the Python API takes when it is not given; None: the host's (``host_default``,
    an attribute of :class:`~sandbox_rt.config.Settings`) or none. ``door_defaults``: another default
    at a door (given to the runtime even if the request says nothing). ``syntax``: what a string (or
    each string of a list or map) must look like (:data:`sandbox_rt.validation.SYNTAX`). ``excludes``:
    options it does not go with, and why. ``spec``: kept in the :class:`SandboxSpec` (else how it is
    made: from a snapshot, on a node). Texts: ``help`` (CLI), ``mcp`` (the MCP tool; default ``help``;
    ``{templates}`` and ``{max_ttl_s}`` are the server's), ``doc`` (the HTTP API's OpenAPI schema).
    """

    kind: Kind
    help: str
    default: Any = None
    doc: str | None = None
    mcp: str | None = None
    syntax: str | None = None
    minimum: int | None = None
    maximum: int | None = None
    exclusive_minimum: int | None = None
    max_items: int | None = None
    doors: frozenset[Door] = frozenset(DOORS)
    door_defaults: Mapping[Door, Any] = dataclasses.field(default_factory=dict)
    policy: Policy | None = None
    host_default: str | None = None
    spec_default: Any = None  # make_spec's value when it is left out (None: the SandboxSpec field's)
    host_bound: HostBound | None = None
    excludes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    spec: bool = True
    flag: str | None = None  # the CLI flag (default: --name-with-dashes)
    metavar: str | None = None
    # in the HTTP API's list entry (GET /v1/sandboxes): "always", or "newer" (servers before it lack it)
    listed: Literal["", "always", "newer"] = ""
    listed_doc: str | None = None
    # filled from CreateOptions
    name: str = ""
    nullable: bool = False

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    def default_at(self, door: Door) -> Any:
        """The value a request that leaves this option out means at ``door``."""
        return self.door_defaults.get(door, self.default)


# who may set what: the OpenSandbox dialect has no field for some; an MCP session may not pick a node
# or mount host directories; the CLI's commands and the MCP server decide ``detached`` themselves
_NOT_OPENSANDBOX: frozenset[Door] = frozenset({"python", "http", "cli", "mcp"})


def _cap(what: str, metavar: str, cli: str, mcp: str, top: int, package: int) -> Option:
    """A cap on what a sandbox shares with its neighbours (sandbox_rt/caps.py): 0 is none, the host
    has a default for it (``default_<name>``), the door policy bounds it."""
    return Option(
        "integer",
        f"{cli} (default: the host's; 0: no cap)",
        doc=what + " Default (absent or null): the host's default_{name}; 0: none.",
        mcp=mcp,
        minimum=0,
        maximum=top,
        doors=_NOT_OPENSANDBOX,
        policy="cap",
        host_default="default_{name}",
        spec_default=package,  # a spec made without a host's defaults has the package's caps
        listed="newer",
        metavar=metavar,
    )


class SpecOptions(TypedDict, total=False):
    """The create options a :class:`SandboxSpec` keeps (``make_spec``'s arguments)."""

    hostname: Annotated[
        str | None,
        Option(
            "string",
            "host name (default: the sandbox id)",
            doc="RFC 1123 host name (default: the sandbox id).",
            mcp="host name (RFC 1123)",
            syntax="host_name",
            doors=_NOT_OPENSANDBOX,
        ),
    ]
    cpus: Annotated[
        float,
        Option(
            "number",
            "CPU cores (a fraction is a quota)",
            DEFAULT_CPUS,
            doc="<= host cores",
            mcp="CPU cores",
            exclusive_minimum=0,
            host_bound="cores",
            listed="always",
        ),
    ]
    memory_mb: Annotated[
        int,
        Option(
            "integer",
            "memory limit in MiB",
            DEFAULT_MEMORY_MB,
            minimum=MIN_MEMORY_MB,
            maximum=MAX_MEMORY_MB,
            listed="always",
            flag="--memory",
            metavar="MB",
        ),
    ]
    disk_gb: Annotated[
        int,
        Option(
            "integer",
            "disk limit in GB",
            DEFAULT_DISK_GB,
            minimum=1,
            maximum=MAX_DISK_GB,
            listed="always",
            flag="--disk",
            metavar="GB",
        ),
    ]
    pids_max: Annotated[
        int,
        Option(
            "integer",
            "processes and threads at most",
            DEFAULT_PIDS_MAX,
            doc="Processes and threads at most. LXC: at most the host's pids budget (kernel.pid_max "
            "less 1/8; the served document's maximum is this host's), and all sandboxes together within "
            "it (409 while they hold it). Proxmox VE: at most the node's ceiling (400 after the start).",
            mcp="processes at most",
            minimum=MIN_PIDS_MAX,
            maximum=MAX_PIDS_MAX,
            host_bound="pids_budget",
            listed="always",
            doors=_NOT_OPENSANDBOX,
            metavar="N",
        ),
    ]
    internet: Annotated[
        bool,
        Option("boolean", "allow HTTP/HTTPS to the internet", False, doc="HTTP/HTTPS egress allowed"),
    ]
    labels: Annotated[
        Mapping[str, str] | None,
        Option(
            "string_map",
            "a label (repeatable)",
            mcp="labels to find it by",
            syntax="label_map",
            listed="always",
            flag="--label",
            metavar="KEY=VALUE",
        ),
    ]
    ttl_s: Annotated[
        int | None,
        Option(
            "integer",
            "destroy by gc after this long (default: the host's default_ttl_s)",
            doc="Lifetime in seconds; gc/the reaper destroy it afterwards (default: the host's "
            "default_ttl_s).",
            mcp="seconds it may live, at most {max_ttl_s}",
            minimum=1,
            maximum=MAX_TTL_S,
            host_default="default_{name}",
            flag="--ttl",
            metavar="SECONDS",
        ),
    ]
    detached: Annotated[
        bool,
        Option(
            "boolean",
            "no owner process: only its TTL ends it (gc --dead-owners spares it)",
            False,
            doc="True (the API's default): the sandbox lives by its TTL, not by the server "
            "process, so a server restart does not make it an orphan.",
            doors=frozenset({"python", "http", "opensandbox"}),
            door_defaults={"http": True, "opensandbox": True, "mcp": False},
        ),
    ]
    egress: Annotated[
        Sequence[str] | None,
        Option(
            "string_list",
            "without internet, allow only this address, network or domain (repeatable)",
            doc="Without internet, reach only these IPv4 addresses, networks and domain names "
            "(resolved by the host's DNS; lxc backend) on the internet ports.",
            mcp="without internet, allow only these domains, IPv4 addresses or networks",
            syntax="destinations",
            max_items=MAX_EGRESS_ENTRIES,
            metavar="DEST",
        ),
    ]
    net_mbps: Annotated[
        int | None,
        _cap(
            "Network bandwidth each way, Mbit/s (LXC: the runtime's SSH session is not counted).",
            "MBIT",
            "network Mbit/s each way",
            "network cap, Mbit/s each way",
            MAX_NET_MBPS,
            DEFAULT_NET_MBPS,
        ),
    ]
    disk_mbps: Annotated[
        int | None,
        _cap(
            "Disk bandwidth, MB/s, each of read and write, on the host's sandbox storage.",
            "MB",
            "disk MB/s each of read and write",
            "disk bandwidth cap, MB/s",
            MAX_DISK_MBPS,
            DEFAULT_DISK_MBPS,
        ),
    ]
    disk_iops: Annotated[
        int | None,
        _cap(
            "Disk operations per second, each of read and write, on the host's sandbox storage.",
            "N",
            "disk operations/s each of read and write",
            "disk operations per second cap",
            MAX_DISK_IOPS,
            DEFAULT_DISK_IOPS,
        ),
    ]
    root: Annotated[
        bool,
        Option(
            "boolean",
            "commands may run as root (exec --user root)",
            False,
            doc="Root on request: commands may run as the sandbox's root (exec with user=root), "
            "e.g. apt-get install through the egress list. The container stays unprivileged; never "
            "taken from the warm pool.",
            mcp="commands may run as root (run_command user=root), e.g. apt-get",
            doors=_NOT_OPENSANDBOX,
            policy="root",
            listed="newer",
            listed_doc="Made with root=True (commands may run as root).",
        ),
    ]
    template: Annotated[
        str | None,
        Option(
            "string",
            "clone this named template (sandbox-rt template ls; default: the host's default)",
            doc=f"Clone this named template (GET /v1/templates; default: {DEFAULT_TEMPLATE!r}); an "
            "unknown name is a 400 naming the known ones. Not with from_snapshot (a fork has its "
            "snapshot's template): 400.",
            mcp="clone this template (one of: {templates}; default: default)",
            syntax="template_name",
            host_bound="templates",
            listed="newer",
            metavar="NAME",
        ),
    ]
    volumes: Annotated[
        Sequence[VolumeMount] | None,
        Option(
            "mounts",
            "mount SRC at PATH: SRC is a volume NAME (NAME/SUB for a directory in it) or a host /DIR "
            "under one the host allows; ':ro' mounts it read-only (repeatable)",
            doc="Mount path in the sandbox -> what is mounted there (lxc backend): absolute, not "
            "/ nor a system directory; a mount inside another's path gets its mount point made there.",
            syntax="mounts",
            doors=frozenset({"python", "http", "cli", "opensandbox"}),
            flag="--volume",
            metavar="SRC:PATH[:ro]",
        ),
    ]


class CreateOptions(SpecOptions, total=False):
    """Every option of ``create`` (``Manager.create(**options)``): :class:`SpecOptions`, and how
    the sandbox is made (from a snapshot, on a node)."""

    from_snapshot: Annotated[
        str | None,
        Option(
            "string",
            "fork this snapshot instead of the template",
            doc="Fork this snapshot (its files, a new identity) instead of the template; 404 if "
            "there is none.",
            mcp="fork a snapshot this session took (snapshot_sandbox)",
            syntax="snapshot_name",
            excludes={
                "template": "a fork is cloned from its snapshot's template",
                "node": "a fork is made on its snapshot's node",
            },
            spec=False,
            metavar="NAME",
        ),
    ]
    node: Annotated[
        str | None,
        Option(
            "string",
            "Proxmox VE cluster: on this node (default: the placement policy)",
            doc="Proxmox VE cluster: make it on this node instead of where the placement policy "
            "puts it (docs/proxmox.md); the served document lists this host's nodes. 400 on a backend "
            "with one host, for an unknown node or one without the template; not with from_snapshot.",
            syntax="node_name",
            host_bound="nodes",
            doors=frozenset({"python", "http", "cli"}),
            spec=False,
            metavar="NODE",
        ),
    ]


# what a create's refusals mean beyond a bad value: the HTTP API documents them on its 400 and 409
CREATE_NOTES = {
    "400": "On create also a value this host cannot give one sandbox: cpus above its cores or "
    "pids_max above its pids budget (the served document's maxima are this host's), a template or "
    "node it lacks; on Proxmox VE a cap above the node's ceiling (pids_max, disk_mbps, disk_iops: "
    "the node's, known after the start; nothing is left).",
    "409": "On create: the host's pids budget is spent by the sandboxes it runs (destroy some, or ask "
    "for a smaller pids_max); nothing is made.",
}


def read_declaration(declaration: type) -> tuple[Option, ...]:
    """The options a ``TypedDict`` of ``Annotated[type, Option(...)]`` declares, in its order, named
    and typed (``{name}`` in ``doc`` and ``host_default`` is the option's name)."""
    found = []
    for name, hint in typing.get_type_hints(declaration, include_extras=True).items():
        meta = [m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Option)]
        if len(meta) != 1:
            raise TypeError(f"create option {name!r} needs exactly one Option in its Annotated type")
        opt = meta[0]
        found.append(
            dataclasses.replace(
                opt,
                name=name,
                nullable=type(None) in typing.get_args(typing.get_args(hint)[0]),
                doc=opt.doc.replace("{name}", name) if opt.doc else None,
                host_default=opt.host_default.replace("{name}", name) if opt.host_default else None,
            )
        )
    return tuple(found)


# The declaration as the doors read it: the CLI's parser, the MCP server, the checks and the policy
# when they are built or run, the HTTP models at import (create_request_model and list_entry_model
# build others). A test may extend it (monkeypatch ``OPTIONS``).
OPTIONS: tuple[Option, ...] = read_declaration(CreateOptions)


def all_options() -> tuple[Option, ...]:
    """Every create option, in the doors' order."""
    return OPTIONS


def option(name: str) -> Option:
    for opt in OPTIONS:
        if opt.name == name:
            return opt
    raise KeyError(name)


def door_options(door: Door) -> tuple[Option, ...]:
    """The options ``door`` lets its callers set."""
    return tuple(o for o in OPTIONS if door in o.doors)


def take(given: Mapping[str, Any], door: Door) -> dict[str, Any]:
    """What a door received, as ``Manager.create`` arguments: absent and None mean the default (left
    out), the door's own defaults are added (``door_defaults``); an option the door does not take is
    a ConfigError, a name that is no option at all a TypeError (a door's bug)."""
    known = {o.name: o for o in OPTIONS}
    out: dict[str, Any] = {}
    for name, value in given.items():
        opt = known.get(name)
        if opt is None:
            raise TypeError(f"create() got an unexpected keyword argument {name!r}")
        if value is None:
            continue
        if door not in opt.doors:
            raise ConfigError(f"{name}= cannot be set through this door ({door})")
        out[name] = value
    for opt in OPTIONS:
        if door in opt.door_defaults and opt.name not in out:
            out[opt.name] = opt.door_defaults[door]
    return out


def named(given: Mapping[str, Any], syntax: str) -> Any:
    """What the options ``given`` name of ``syntax`` (e.g. ``snapshot_name``: the snapshot a create
    forks), or None: for the doors whose rules concern a named thing, not a particular option."""
    for opt in OPTIONS:
        if opt.syntax == syntax and given.get(opt.name) is not None:
            return given[opt.name]
    return None


# -- the volumes map, as the HTTP API carries it (the server reads it, the remote clients write it) ----
def mounts_to_wire(mounts: Sequence[VolumeMount]) -> dict[str, dict[str, Any]]:
    """Mounts as the API's map: mount path -> its source (checked first by the caller: a mount path
    given twice would otherwise be lost in the map)."""
    out: dict[str, dict[str, Any]] = {}
    for m in mounts:
        source = {"volume": m.volume} if m.volume is not None else {"host_path": m.host_path}
        out[m.mount_path] = {**source, "sub_path": m.sub_path, "read_only": m.read_only}
    return out


def mounts_from_wire(wire: Mapping[str, Mapping[str, Any]]) -> list[VolumeMount]:
    """The API's map as mounts (each source's fields are :class:`VolumeMount`'s)."""
    return [VolumeMount(path, **source) for path, source in wire.items()]


@functools.cache
def _spec_fields() -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(SandboxSpec))


def check_declaration() -> None:
    """The declaration and the spec agree: every ``spec`` option is a SandboxSpec field and the Python
    default of each is the spec's (caps and the TTL: the host's, template: ``default``)."""
    defaults = {f.name: f.default for f in dataclasses.fields(SandboxSpec)}
    for opt in OPTIONS:
        if opt.spec and opt.name not in _spec_fields():
            raise TypeError(f"create option {opt.name!r} is declared a spec option but SandboxSpec lacks it")
        if opt.spec and opt.default is not None and defaults[opt.name] != opt.default:
            raise TypeError(f"create option {opt.name!r}: default {opt.default!r} is not the spec's")


check_declaration()
