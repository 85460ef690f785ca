"""The lifecycle API's bodies as OpenSandbox writes them (sandbox-lifecycle.yml, and the fields the
published ``opensandbox`` SDK sends beyond it): requests checked field by field for their JSON kind
(unknown fields refused), answers built from the runtime's records.

What each field means here is :mod:`.mapping`'s business; this module only reads and writes JSON.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, RootModel

from ...models import SandboxRecord, SnapshotInfo
from ..kinds import Kind
from .state import SandboxNotes

__all__ = [
    "CreateSandboxBody",
    "CreateSnapshotBody",
    "ImageSpecBody",
    "MetadataPatchBody",
    "NetworkPolicyBody",
    "NetworkRuleBody",
    "PlatformBody",
    "RenewBody",
    "Status",
    "TelemetryBody",
    "VolumeBody",
    "page_of",
    "rfc3339",
    "sandbox_json",
    "snapshot_json",
]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ImageSpecBody(_Body):
    uri: Annotated[Any, Kind("string", minLength=1)]
    auth: Any = None  # refused when given: no registries (see mapping)


class NetworkRuleBody(_Body):
    action: Annotated[Any, Kind("string", enum=["allow", "deny"])]
    target: Annotated[Any, Kind("string", minLength=1)]


class NetworkPolicyBody(_Body):
    default_action: Annotated[Any, Kind("string", nullable=True, enum=["allow", "deny"])] = Field(
        default=None, alias="defaultAction"
    )
    egress: list[NetworkRuleBody] | None = None


class HostVolumeBody(_Body):
    path: Annotated[Any, Kind("string", minLength=1)]


class PvcBody(_Body):
    """A named volume (``sandbox-rt volume``); the Kubernetes-only hints are accepted and ignored,
    as OpenSandbox's Docker runtime does."""

    claim_name: Annotated[Any, Kind("string", minLength=1)] = Field(alias="claimName")
    create_if_not_exists: Annotated[Any, Kind("boolean")] = Field(default=True, alias="createIfNotExists")
    delete_on_sandbox_termination: Annotated[Any, Kind("boolean")] = Field(
        default=False, alias="deleteOnSandboxTermination"
    )
    storage_class: Annotated[Any, Kind("string", nullable=True)] = Field(default=None, alias="storageClass")
    storage: Annotated[Any, Kind("string", nullable=True)] = None
    access_modes: Annotated[Any, Kind("string_list", nullable=True)] = Field(
        default=None, alias="accessModes"
    )


class VolumeBody(_Body):
    name: Annotated[Any, Kind("string", minLength=1)]
    host: HostVolumeBody | None = None
    pvc: PvcBody | None = None
    ossfs: Any = None  # refused when given (see mapping)
    mount_path: Annotated[Any, Kind("string", minLength=1)] = Field(alias="mountPath")
    read_only: Annotated[Any, Kind("boolean")] = Field(default=False, alias="readOnly")
    sub_path: Annotated[Any, Kind("string", nullable=True)] = Field(default=None, alias="subPath")


class PlatformBody(_Body):
    os: Annotated[Any, Kind("string")]
    arch: Annotated[Any, Kind("string")]


class CredentialProxyBody(_Body):
    enabled: Annotated[Any, Kind("boolean")] = False


class CreateSandboxBody(_Body):
    """POST /v1/sandboxes (the spec's CreateSandboxRequest and the SDK's extra fields)."""

    image: ImageSpecBody | None = None
    snapshot_id: Annotated[Any, Kind("string", nullable=True)] = Field(default=None, alias="snapshotId")
    template_id: Any = Field(default=None, alias="templateId")
    platform: PlatformBody | None = None
    timeout: Annotated[Any, Kind("integer", nullable=True)] = None
    resource_limits: Annotated[Any, Kind("string_map", nullable=True)] = Field(
        default=None, alias="resourceLimits"
    )
    resource_requests: Annotated[Any, Kind("string_map", nullable=True)] = Field(
        default=None, alias="resourceRequests"
    )
    env: Annotated[Any, Kind("string_map", nullable=True)] = None
    metadata: Annotated[Any, Kind("string_map", nullable=True)] = None
    lifecycle: Any = None
    entrypoint: Annotated[Any, Kind("string_list", nullable=True)] = None
    network_policy: NetworkPolicyBody | None = Field(default=None, alias="networkPolicy")
    credential_proxy: CredentialProxyBody | None = Field(default=None, alias="credentialProxy")
    secure_access: Annotated[Any, Kind("boolean", nullable=True)] = Field(default=None, alias="secureAccess")
    volumes: list[VolumeBody] | None = None
    extensions: Annotated[Any, Kind("string_map", nullable=True)] = None


class RenewBody(_Body):
    expires_at: Annotated[Any, Kind("string")] = Field(alias="expiresAt")


class CreateSnapshotBody(_Body):
    name: Annotated[Any, Kind("string", nullable=True)] = None


class MetadataPatchBody(RootModel[dict[str, Annotated[Any, Kind("string", nullable=True)]]]):
    """A JSON Merge Patch (RFC 7396) of the metadata: a string sets a key, null removes it."""


class TelemetryBody(RootModel[dict[str, Any]]):
    """What the SDK reports of a create (``eventType``, ``createDurationMs``...): any JSON object."""


# -- answers -----------------------------------------------------------------------------------------
class Status(BaseModel):
    """A sandbox's ``status``: the spec's state name, and why."""

    state: str
    reason: str | None = None
    message: str | None = None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


def rfc3339(t: float) -> str:
    """A POSIX time as RFC 3339 in UTC (``2025-11-16T14:30:45.123456Z``)."""
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat().replace("+00:00", "Z")


def sandbox_json(
    record: SandboxRecord, status: Status, notes: SandboxNotes | None, *, full: bool = True
) -> dict[str, Any]:
    """The spec's Sandbox (``full``) or CreateSandboxResponse (without its startup source)."""
    out: dict[str, Any] = {"id": record.id, "status": status.to_json()}
    if full:
        if notes is not None and notes.snapshot_id is not None:
            out["snapshotId"] = notes.snapshot_id
        else:  # the template it was cloned from stands in for an image
            out["image"] = {"uri": notes.image if notes and notes.image else record.spec.template}
    out["metadata"] = dict(record.spec.labels)
    out["entrypoint"] = list(notes.entrypoint) if notes is not None else []
    if record.expires_at is not None:
        out["expiresAt"] = rfc3339(record.expires_at)
    out["createdAt"] = rfc3339(record.created_at)
    return out


def snapshot_json(info: SnapshotInfo) -> dict[str, Any]:
    """The spec's Snapshot: ours are made whole before the answer, so always Ready; its id is its
    name."""
    return {
        "id": info.name,
        "sandboxId": info.source_id,
        "name": info.name,
        "status": {"state": "Ready"},
        "createdAt": rfc3339(info.created_at),
    }


def page_of(items: Sequence[Any], page: int, page_size: int) -> tuple[Sequence[Any], dict[str, Any]]:
    """(the items of page ``page``, the spec's PaginationInfo)."""
    total = len(items)
    pages = -(-total // page_size)
    start = (page - 1) * page_size
    info: Mapping[str, Any] = {
        "page": page,
        "pageSize": page_size,
        "totalItems": total,
        "totalPages": pages,
        "hasNextPage": page < pages,
    }
    return items[start : start + page_size], dict(info)
