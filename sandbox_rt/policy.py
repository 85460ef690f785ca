"""What the doors agents use may ask of ``create``: the operator's limits they cannot widen.

The doors are the native HTTP API (``sandbox-rt serve``), its OpenSandbox dialect
(``--opensandbox-port``) and the MCP server (``sandbox-rt mcp``); the remote clients reach the
native API. Whoever holds their token is a client, often an agent, not the operator: what they may
ask is narrower than what the operator's own CLI (``sandbox-rt run``) and Python (``Manager.create``)
may. Until per-tenant policies exist, one :class:`DoorPolicy` per server says how much narrower,
and every door checks each create request with :meth:`DoorPolicy.check_create` before it calls the
runtime:

- ``root=True`` only if the operator started the door with ``--allow-root`` (``allow_root``);
- the caps (``net_mbps``, ``disk_mbps``, ``disk_iops``) may be left out (the host's defaults,
  ``host.json``'s ``default_*``) or lowered, but not switched off (0) nor raised above the host's
  default, unless the operator started the door with ``--allow-uncapped`` (``allow_uncapped``). A
  cap of 100 000 MB/s is no cap either, so the bound is the default, not only "not 0". A host whose
  default is 0 (the operator set no cap) has nothing to widen: any value passes.

The two switches are separate: a root sandbox keeps its caps unless the operator also allows
uncapped ones. A refusal is a :class:`~sandbox_rt.errors.PolicyDenied` naming the option; the HTTP
doors answer it 403 ``policy_denied``, MCP a tool error ``policy_denied``, and the remote clients
raise it again. Nothing is made before the check.

The other create options have no "unlimited" value a request could pick (``None`` means the
package's or the host's default, never none): ``pids_max`` is at least 16 and the sandboxes' sum
stays within the host's pid budget (``sandbox_rt.caps.pid_budget``), ``cpus`` within the host's
cores, ``ttl_s`` within ``MAX_TTL_S`` (MCP: ``--max-ttl``). Their ranges are wide (``memory_mb`` up
to 1 PiB, whatever the host has): bounding them per client is the per-tenant policies' job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .caps import DEFAULT_DISK_IOPS, DEFAULT_DISK_MBPS, DEFAULT_NET_MBPS
from .config import Settings
from .errors import ConfigError, PolicyDenied
from .options import Door, Option, all_options, take

__all__ = ["CAP_OPTIONS", "DoorPolicy"]

# the create options whose 0 means "no cap" (sandbox_rt/caps.py), as sandbox_rt.options declares them
CAP_OPTIONS = tuple(o.name for o in all_options() if o.policy == "cap")


@dataclasses.dataclass(frozen=True)
class DoorPolicy:
    """What one door lets its clients ask of ``create`` (``sandbox-rt serve`` / ``mcp`` build it from
    ``--allow-root``, ``--allow-uncapped`` and host.json; :meth:`of` for a runtime in Python).

    ``max_*``: the most each cap may be through this door, the host's defaults (0: the host sets
    no cap, so none is enforced here either). ``door`` names the server in messages.
    """

    allow_root: bool = False
    allow_uncapped: bool = False
    max_net_mbps: int = DEFAULT_NET_MBPS
    max_disk_mbps: int = DEFAULT_DISK_MBPS
    max_disk_iops: int = DEFAULT_DISK_IOPS
    door: str = "sandbox-rt serve"

    def __post_init__(self) -> None:
        for name in ("allow_root", "allow_uncapped"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"DoorPolicy {name}={getattr(self, name)!r} must be True or False")
        for name in CAP_OPTIONS:
            value = self.ceiling(name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"DoorPolicy max_{name}={value!r} must be a whole number >= 0 (0: no cap)")

    @classmethod
    def of(
        cls,
        runtime: object,
        *,
        door: str = "sandbox-rt serve",
        allow_root: bool = False,
        allow_uncapped: bool = False,
    ) -> DoorPolicy:
        """The policy for a door over ``runtime``: its settings' default caps as the bounds (a
        ``sandbox_rt.Manager``; anything else, e.g. a test's fake: the package's defaults)."""
        settings = getattr(runtime, "settings", None)
        ceilings: dict[str, Any] = {}
        if isinstance(settings, Settings):  # each cap's bound: the host's default (options' host_default)
            caps = (o for o in all_options() if o.policy == "cap" and o.host_default is not None)
            ceilings = {f"max_{o.name}": getattr(settings, o.host_default or "") for o in caps}
        return cls(allow_root=allow_root, allow_uncapped=allow_uncapped, door=door, **ceilings)

    def ceiling(self, cap: str) -> int:
        """The most ``cap`` (one of :data:`CAP_OPTIONS`) may be through this door; 0: unbounded."""
        value: int = getattr(self, f"max_{cap}")
        return value

    def describe(self, opt: Option, text: str) -> str:
        """An option's help ``text`` with what this door lets its clients ask of it (the MCP tool's
        parameters say it to the model)."""
        if opt.policy == "cap":
            top = self.ceiling(opt.name)
            return text if self.allow_uncapped or not top else f"{text}, 1 to {top} (default {top})"
        if opt.policy == "root" and not self.allow_root:
            return f"{text}; this server refuses it (its operator did not allow root)"
        return text

    def admit(self, request: Mapping[str, Any], door: Door) -> dict[str, Any]:
        """A create request received at ``door`` as ``Manager.create`` arguments
        (:func:`sandbox_rt.options.take`: the door's defaults added, what it does not take refused),
        checked against this policy (:meth:`check_create`). Every agent-facing create calls it."""
        self.check_create(request)  # first: a refusal is a refusal, whatever else is wrong
        return take(request, door)

    def check_create(self, request: Mapping[str, Any]) -> None:
        """Raise PolicyDenied if the create arguments ``request`` (``Manager.create``'s names; an
        absent or None option is the host's default) ask for more than this door allows.

        Only the policy: a value of a wrong kind or out of range is left to ``make_spec`` (400)."""
        for opt in all_options():
            if opt.policy == "root" and request.get(opt.name) not in (None, False) and not self.allow_root:
                raise PolicyDenied(
                    f"{opt.name}=true is refused: {self.door} makes root sandboxes for its clients only "
                    "if its operator starts it with --allow-root"
                )
        if self.allow_uncapped:
            return
        refused: list[str] = []
        bounds: list[str] = []
        for cap in CAP_OPTIONS:
            value = request.get(cap)
            ceiling = self.ceiling(cap)
            if ceiling == 0 or isinstance(value, bool) or not isinstance(value, int | float):
                continue  # the host sets no cap; or absent (the default), or make_spec's to refuse
            if value == 0:
                refused.append(f"{cap}=0 (no cap)")
            elif value > ceiling:
                refused.append(f"{cap}={value!r} (above the host's default of {ceiling})")
            else:
                continue
            bounds.append(f"{cap} 1 to {ceiling}")
        if refused:
            raise PolicyDenied(
                f"{', '.join(refused)} refused: through {self.door} a cap may be lowered "
                f"({', '.join(bounds)}), not raised or switched off, unless its operator starts it "
                "with --allow-uncapped"
            )
