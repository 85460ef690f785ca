"""What an OpenSandbox lifecycle request means in this runtime's terms, checked strictly: a value we
cannot honour exactly is a ConfigError (400) naming the field, never something close enough, and a
network policy is never made wider than asked.

- ``resourceLimits``: Kubernetes quantities (``cpu: "500m"``, ``memory: "512Mi"``,
  ``ephemeral-storage: "8Gi"``) to ``cpus``, ``memory_mb``, ``disk_gb``;
- ``networkPolicy``: to ``internet`` and the ``egress`` allow-list;
- the runtime's states to the spec's names.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import os
import platform
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, Literal

from ...errors import ConfigError
from ...manager import PAUSED_STATES
from ...models import VolumeMount
from ...validation import MAX_TTL_S, check_env, check_labels
from ...volumes import check_mounts, check_volume_name
from .egress_policy import Rule, to_egress
from .lifecycle_models import CreateSandboxBody, NetworkPolicyBody, PlatformBody, Status, VolumeBody

__all__ = [
    "MIN_TIMEOUT_S",
    "NOOP_ENTRYPOINT",
    "RESERVED_PREFIXES",
    "SANDBOX_STATES",
    "SNAPSHOT_STATES",
    "CreatePlan",
    "check_metadata",
    "expiry_ttl",
    "parse_cpu",
    "parse_quantity",
    "plan_create",
    "policy_egress",
    "resource_kwargs",
    "sandbox_status",
]

SANDBOX_STATES = ("Pending", "Running", "Pausing", "Paused", "Resuming", "Stopping", "Terminated", "Failed")
SNAPSHOT_STATES = ("Creating", "Ready", "Deleting", "Failed")
MIN_TIMEOUT_S = 60  # the spec's minimum ``timeout``
# Docker's keep-alive, the SDK's default entrypoint: a sandbox here lives without one, so it is
# reported as asked but not started (it would only be a process doing nothing)
NOOP_ENTRYPOINT = ("tail", "-f", "/dev/null")
# metadata keys the dialect refuses: the spec reserves its own prefix, the runtime uses its own
RESERVED_PREFIXES = ("opensandbox.io/", "sandbox-rt.")
MAX_ENTRYPOINT_WORDS = 1024
# every command of the sandbox starts with it (and Linux takes at most 128 KiB per string, ~2 MiB in all)
MAX_ENV_VARS = 1024
MAX_ENV_BYTES = 256 << 10
MAX_ENTRYPOINT_BYTES = 64 << 10

_MILLICORES = re.compile(r"([0-9]{1,9})m")
_CORES = re.compile(r"[0-9]{1,6}(?:\.[0-9]{1,6})?")
_QUANTITY = re.compile(r"([0-9]{1,15}(?:\.[0-9]{1,9})?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")
_UNITS = {
    None: 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "Pi": 1 << 50,
    "Ei": 1 << 60,
}
_RESOURCE_KEYS = ("cpu", "memory", "ephemeral-storage", "gpu")
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


# -- resources ---------------------------------------------------------------------------------------
def parse_cpu(value: str, field: str = "resourceLimits.cpu") -> float:
    """``"500m"`` -> 0.5, ``"2"`` -> 2.0, ``"1.5"`` -> 1.5; more than the host's cores, zero or any
    other form is a ConfigError."""
    if m := _MILLICORES.fullmatch(value):
        cpus = int(m.group(1)) / 1000
    elif _CORES.fullmatch(value):
        cpus = float(value)
    else:
        raise ConfigError(f'{field} {value!r} must be cores ("1", "1.5") or millicores ("500m")')
    host = os.cpu_count() or 1
    if not 0 < cpus <= host:
        raise ConfigError(f"{field} {value!r} must be more than 0 and at most this host's {host} cores")
    return cpus


def parse_quantity(value: str, field: str) -> int:
    """A Kubernetes quantity of bytes (``"512Mi"``, ``"1G"``, ``"1073741824"``) as a whole number."""
    m = _QUANTITY.fullmatch(value)
    if m is None:
        raise ConfigError(
            f"{field} {value!r} must be a number of bytes, optionally with a unit "
            '(Ki, Mi, Gi, Ti or k, M, G, T), e.g. "512Mi"'
        )
    return int(Decimal(m.group(1)) * _UNITS[m.group(2)])


def resource_kwargs(limits: Mapping[str, str] | None, field: str = "resourceLimits") -> dict[str, Any]:
    """``Manager.create`` arguments for ``resourceLimits`` (nothing given: the host's defaults).
    Memory and disk are rounded down to whole MiB and GiB (never more than asked)."""
    out: dict[str, Any] = {}
    for key, value in (limits or {}).items():
        where = f"{field}.{key}"
        if key == "cpu":
            out["cpus"] = parse_cpu(value, where)
        elif key == "memory":
            out["memory_mb"] = parse_quantity(value, where) >> 20
        elif key == "ephemeral-storage":
            out["disk_gb"] = parse_quantity(value, where) >> 30
            if out["disk_gb"] < 1:
                raise ConfigError(f"{where} {value!r} is less than the smallest disk, 1Gi")
        elif key == "gpu":
            if value != "0":
                raise ConfigError(f'{where} {value!r}: sandboxes here have no GPUs (only "0" is accepted)')
        else:
            raise ConfigError(f"{where} is not supported (supported: {', '.join(_RESOURCE_KEYS)})")
    return out


# -- the network policy ------------------------------------------------------------------------------
def policy_egress(policy: NetworkPolicyBody | None) -> tuple[bool, tuple[str, ...]]:
    """(internet, egress) for a create's ``networkPolicy``, by the same exact mapping as the egress
    API's (:func:`.egress_policy.to_egress`): a policy the sandbox cannot enforce as written is a
    ConfigError, never a wider one.

    - absent, null or ``{}``: the runtime's default, no network (OpenSandbox's servers start
      allow-all; here a sandbox is offline unless asked otherwise);
    - ``defaultAction`` omitted with rules: ``deny``, as the spec says.
    """
    if policy is None or (policy.default_action is None and not policy.egress):
        return False, ()
    given = policy.default_action or "deny"
    if given not in ("allow", "deny"):
        raise ConfigError(f'networkPolicy.defaultAction {given!r} must be "allow" or "deny"')
    action: Literal["allow", "deny"] = "allow" if given == "allow" else "deny"
    rules = []
    for i, rule in enumerate(policy.egress or []):
        if rule.action not in ("allow", "deny"):
            raise ConfigError(f'networkPolicy.egress[{i}].action {rule.action!r} must be "allow" or "deny"')
        rules.append(Rule(rule.action, rule.target))
    try:
        internet, egress = to_egress(action, rules)
    except ConfigError as exc:
        raise ConfigError(f"networkPolicy: {exc}") from None
    return internet, tuple(egress)


# -- create ------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class CreatePlan:
    """A create request checked: ``kwargs`` for ``Manager.create``, and what the dialect keeps."""

    kwargs: dict[str, Any]
    env: dict[str, str]
    entrypoint: tuple[str, ...]
    image: str | None
    snapshot_id: str | None
    # named volumes to make first unless they exist (pvc.createIfNotExists)
    new_volumes: tuple[str, ...] = ()

    @property
    def starts_entrypoint(self) -> bool:
        return bool(self.entrypoint) and self.entrypoint != NOOP_ENTRYPOINT


def check_metadata(labels: Mapping[str, str], field: str = "metadata") -> dict[str, str]:
    """Metadata as labels (the runtime's rules for keys and values); reserved prefixes refused."""
    for key in labels:
        if key.startswith(RESERVED_PREFIXES):
            raise ConfigError(f"{field} key {key!r} is reserved ({' and '.join(RESERVED_PREFIXES)} keys)")
    try:
        return check_labels(labels)
    except ConfigError as exc:
        raise ConfigError(f"{field}: {exc}") from None


def _check_platform(p: PlatformBody) -> None:
    arch = _ARCH.get(platform.machine().lower(), platform.machine().lower())
    if p.os != "linux" or p.arch != arch:
        raise ConfigError(f"platform {p.os}/{p.arch} cannot be satisfied: sandboxes here are linux/{arch}")


def _check_entrypoint(argv: Sequence[str]) -> tuple[str, ...]:
    if not argv:
        raise ConfigError("field 'entrypoint' must have at least one word")
    if len(argv) > MAX_ENTRYPOINT_WORDS or sum(len(w) for w in argv) > MAX_ENTRYPOINT_BYTES:
        raise ConfigError(f"field 'entrypoint' is larger than {MAX_ENTRYPOINT_WORDS} words or 64 KiB")
    if not argv[0] or any("\x00" in w for w in argv):
        raise ConfigError("field 'entrypoint' must name a program and hold no NUL")
    return tuple(argv)


def plan_create(body: CreateSandboxBody, templates: Sequence[str]) -> CreatePlan:
    """Check a create request against this host; ConfigError naming the first field we cannot honour."""
    unsupported = {
        "templateId": (body.template_id, "fsb templates do not exist here: name a template in image.uri"),
        "lifecycle": (body.lifecycle, "lifecycle hooks are not supported"),
        "extensions": (body.extensions, "no extensions are supported"),
    }
    for name, (value, why) in unsupported.items():
        if value not in (None, [], {}):
            raise ConfigError(f"field {name!r}: {why}")
    if body.secure_access:
        raise ConfigError("field 'secureAccess': endpoints are always behind this server's API key")
    if body.credential_proxy is not None and body.credential_proxy.enabled:
        raise ConfigError("field 'credentialProxy': the credential vault proxy is not supported")
    if body.platform is not None:
        _check_platform(body.platform)
    if (body.image is None) == (body.snapshot_id is None):
        raise ConfigError("give exactly one of the fields 'image' (a template name) and 'snapshotId'")
    kwargs: dict[str, Any] = {}  # detached: the dialect's default (it lives by its TTL, not by the server)
    image: str | None = None
    if body.image is not None:
        if body.image.auth is not None:
            raise ConfigError("field 'image.auth': there are no registries here, so no credentials")
        image = body.image.uri
        if image not in templates:
            raise ConfigError(
                f"image.uri {image!r} is not a template of this host (container images are not pulled "
                f"here: a template stands in for one); known: {', '.join(templates)}"
            )
        kwargs["template"] = image
    else:
        kwargs["from_snapshot"] = body.snapshot_id
    if body.timeout is not None:
        if not MIN_TIMEOUT_S <= body.timeout <= MAX_TTL_S:
            raise ConfigError(f"field 'timeout' must be between {MIN_TIMEOUT_S} and {MAX_TTL_S} seconds")
        kwargs["ttl_s"] = int(body.timeout)
    kwargs.update(resource_kwargs(body.resource_limits))
    resource_kwargs(body.resource_requests, "resourceRequests")  # checked; limits are what binds here
    if body.metadata:
        kwargs["labels"] = check_metadata(body.metadata)
    internet, egress = policy_egress(body.network_policy)
    kwargs["internet"] = internet
    if egress:
        kwargs["egress"] = list(egress)
    try:
        env = check_env(body.env)
    except ConfigError as exc:
        raise ConfigError(f"field 'env': {exc}") from None
    if len(env) > MAX_ENV_VARS or sum(len(k) + len(v) for k, v in env.items()) > MAX_ENV_BYTES:
        raise ConfigError(f"field 'env' is larger than {MAX_ENV_VARS} variables or {MAX_ENV_BYTES >> 10} KiB")
    entrypoint = _check_entrypoint(body.entrypoint) if body.entrypoint is not None else NOOP_ENTRYPOINT
    mounts, new_volumes = plan_volumes(body.volumes or [])
    if mounts:
        kwargs["volumes"] = list(mounts)
    return CreatePlan(kwargs, env, entrypoint, image, body.snapshot_id, new_volumes)


def plan_volumes(volumes: Sequence[VolumeBody]) -> tuple[tuple[VolumeMount, ...], tuple[str, ...]]:
    """``volumes`` as mounts (``pvc``: a named volume, ``host``: a host path the operator allows),
    and the named volumes to make first; ConfigError naming the entry we cannot honour."""
    mounts: list[VolumeMount] = []
    new: list[str] = []
    names: set[str] = set()
    for i, v in enumerate(volumes):
        where = f"volumes[{i}]"
        try:
            check_volume_name(v.name)
        except ConfigError as exc:
            raise ConfigError(f"{where}.name: {exc}") from None
        if v.name in names:
            raise ConfigError(f"{where}.name {v.name!r} is not unique within the sandbox")
        names.add(v.name)
        if v.ossfs is not None:
            raise ConfigError(f"{where}.ossfs: object storage mounts are not supported (use pvc or host)")
        if (v.host is None) == (v.pvc is None):
            raise ConfigError(f"{where} must have exactly one of 'host' and 'pvc'")
        if v.pvc is not None:
            if v.pvc.delete_on_sandbox_termination:
                raise ConfigError(
                    f"{where}.pvc.deleteOnSandboxTermination: volumes here outlive sandboxes; "
                    "remove one with `sandbox-rt volume rm NAME`"
                )
            try:
                check_volume_name(v.pvc.claim_name)
            except ConfigError as exc:
                raise ConfigError(f"{where}.pvc.claimName: {exc}") from None
            if v.pvc.create_if_not_exists:
                new.append(v.pvc.claim_name)
        volume = v.pvc.claim_name if v.pvc is not None else None
        host_path = v.host.path if v.host is not None else None
        mounts.append(VolumeMount(v.mount_path, volume, host_path, v.sub_path, v.read_only))
    try:
        return check_mounts(mounts), tuple(dict.fromkeys(new))
    except ConfigError as exc:
        raise ConfigError(f"volumes: {exc}") from None


def expiry_ttl(expires_at: str, now: float) -> int:
    """Seconds from ``now`` to an RFC 3339 ``expiresAt`` (rounded up); ConfigError unless it is in
    the future, within the runtime's longest TTL, and says its time zone."""
    try:
        when = dt.datetime.fromisoformat(expires_at)
    except ValueError:
        raise ConfigError(f"field 'expiresAt' {expires_at!r:.80} is not an RFC 3339 time") from None
    if when.tzinfo is None:
        raise ConfigError(f"field 'expiresAt' {expires_at!r:.80} must say its time zone (e.g. Z)")
    ttl = math.ceil(when.timestamp() - now)
    if ttl < 1:
        raise ConfigError(f"field 'expiresAt' {expires_at!r:.80} is not in the future")
    if ttl > MAX_TTL_S:
        raise ConfigError(f"field 'expiresAt' is more than {MAX_TTL_S} s ({MAX_TTL_S // 86400} days) away")
    return ttl


# -- states ------------------------------------------------------------------------------------------
def sandbox_status(state: str, entrypoint_pid: int | None = None) -> Status:
    """The spec's status for a state of ``Backend.state``."""
    if state == "running":
        msg = f"entrypoint runs as background process {entrypoint_pid}" if entrypoint_pid else None
        return Status(state="Running", message=msg)
    if state == PAUSED_STATES[0]:
        return Status(state="Paused", reason="paused", message="its processes are frozen until resume")
    if state in PAUSED_STATES:
        return Status(state="Pausing", reason="pausing", message="its processes are being frozen")
    if state == "starting":
        return Status(state="Pending", reason="starting")
    if state in ("stopping", "aborting"):
        return Status(state="Stopping", reason=state)
    if state == "absent":  # destroyed while it was being listed
        return Status(state="Terminated", reason="deleted")
    if state == "stopped":
        return Status(
            state="Failed",
            reason="stopped",
            message="its container is stopped (e.g. the host restarted) and runs nothing: delete it",
        )
    return Status(state="Failed", reason="unknown_state", message=f"the engine reports {state!r:.40}")
