"""Where a new sandbox goes in a PVE cluster: a pure policy over ``GET /cluster/resources`` rows.

Policy (docs/proxmox.md, "Placement"):

1. Candidates are the nodes that are ``online`` and hold a copy of the requested template (one CT
   template per node, each with its own VMID: a linked clone lives on its template's node and
   storage). A ``node=`` request (per call, else the host contract's ``pve_node``) narrows them to
   that node; asking for an unknown node, an offline one or one without the template is an error
   that names the nodes that would do.
2. They are ranked by **most free memory** (``maxmem - mem`` of the node row, less what this
   process is placing there right now), then **fewest sandboxes** (our CTs on the node, by tag),
   then by name (deterministic). PVE shows a node's memory only to a token with ``Sys.Audit`` on
   ``/nodes/<node>``; a node whose memory is not shown ranks after those whose memory is, so
   without that privilege the order is fewest sandboxes first.

The create tries the ranked nodes in order: one that answers 595 (PVE cannot reach it) is skipped
and the next one gets the sandbox, within the same call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ...errors import BackendError, ConfigError
from .description import tags_of

__all__ = ["NodeView", "cluster_view", "rank"]

_MIB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class NodeView:
    """What the placement knows of one node."""

    name: str
    online: bool
    free_bytes: int | None  # maxmem - mem; None when the token may not see the node's memory
    sandboxes: int  # our CTs (tag ``sandbox-rt``) on the node
    template_vmid: int | None  # the copy of the requested template on this node, if any


def cluster_view(
    rows: Iterable[Mapping[str, Any]], template_vmids: Sequence[int], tag: str
) -> list[NodeView]:
    """One :class:`NodeView` per ``type=node`` row. ``template_vmids``: the VMIDs of the requested
    template's copies, in the host contract's order (the first one found on a node is used)."""
    rows = list(rows)
    sandboxes: dict[str, int] = {}
    templates: dict[str, int] = {}
    wanted = {vmid: i for i, vmid in enumerate(template_vmids)}
    for row in rows:
        if row.get("type") != "lxc":
            continue
        node = str(row.get("node", ""))
        if tag in tags_of(row.get("tags")):
            sandboxes[node] = sandboxes.get(node, 0) + 1
        vmid = _int(row.get("vmid"))
        if vmid in wanted and _int(row.get("template")):
            have = templates.get(node)
            if have is None or wanted[vmid] < wanted[have]:
                templates[node] = vmid
    out: list[NodeView] = []
    for row in rows:
        if row.get("type") != "node":
            continue
        name = str(row.get("node", ""))
        mem, maxmem = _int(row.get("mem")), _int(row.get("maxmem"))
        out.append(
            NodeView(
                name=name,
                online=row.get("status") == "online",
                free_bytes=maxmem - mem if maxmem and mem is not None else None,
                sandboxes=sandboxes.get(name, 0),
                template_vmid=templates.get(name),
            )
        )
    return sorted(out, key=lambda v: v.name)


def rank(
    views: Sequence[NodeView],
    *,
    template: str,
    node: str | None = None,
    placing_mb: Mapping[str, int] | None = None,
) -> list[NodeView]:
    """The nodes that may take a sandbox of ``template``, best first (module docstring).

    ``node``: only that one (ConfigError if the cluster has no such node or it has no copy of the
    template; BackendError if it is offline). ``placing_mb``: MiB this process is placing on each
    node now (creates in flight, not yet in the node's ``mem``). BackendError if no node qualifies.
    """
    placing = placing_mb or {}
    if node:
        named = [v for v in views if v.name == node]
        if not named:
            known = ", ".join(v.name for v in views) or "none"
            raise ConfigError(f"node {node!r} is not a node of this cluster (nodes: {known})")
        view = named[0]
        if view.template_vmid is None:
            raise ConfigError(
                f"node {node!r} has no copy of template {template!r}: linked clones need the template "
                f"on the clone's node (pve_node_templates in the host contract; nodes with it: "
                f"{_names(v for v in views if v.template_vmid is not None)})"
            )
        if not view.online:
            raise BackendError(f"node {node!r} is offline", step="clone")
        return [view]
    usable = [v for v in views if v.online and v.template_vmid is not None]
    if not usable:
        raise BackendError(
            f"no online node holds template {template!r} (online: "
            f"{_names(v for v in views if v.online)}; with the template: "
            f"{_names(v for v in views if v.template_vmid is not None)})",
            step="clone",
        )

    def key(v: NodeView) -> tuple[int, int, int, str]:
        if v.free_bytes is None:
            return (1, 0, v.sandboxes, v.name)
        return (0, -(v.free_bytes - placing.get(v.name, 0) * _MIB), v.sandboxes, v.name)

    return sorted(usable, key=key)


def _names(views: Iterable[NodeView]) -> str:
    return ", ".join(v.name for v in views) or "none"


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
