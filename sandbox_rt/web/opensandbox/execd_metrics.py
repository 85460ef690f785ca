"""execd's ``GET /metrics`` and ``GET /metrics/watch`` from the sandbox's cgroup as the host reads
it (``Sandbox.status().usage``), never from inside the sandbox: its CPUs and memory limit, the
memory it uses, and its CPU use in percent of its CPUs since the previous sample (a first sample
waits half a second for a second one). ``watch`` sends one JSON object per line every second, for at
most :data:`WATCH_MAX_S` seconds, then ends (reconnect for more).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from typing import Any

from fastapi.responses import StreamingResponse

from ...errors import SandboxError
from ..params import Ctx, SandboxId
from .execd_registry import Reg, Registry
from .execd_runtime import ExecdSandbox, execd_router, sandbox_of
from .execd_sse import SSE_HEADERS, SSE_MEDIA_TYPE

__all__ = ["WATCH_MAX_S", "router"]

WATCH_MAX_S = 300.0
_FIRST_SAMPLE_S = 0.5
_STALE_S = 60.0  # a previous sample older than this is not used

router = execd_router()


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) and value >= 0 else 0.0


def _metrics(sb: ExecdSandbox, reg: Registry, *, wait: bool) -> dict[str, Any]:
    status = sb.status()
    now, cpu = time.monotonic(), _number(status.usage.cpu_time_s)
    previous = reg.swap_sample(sb.id, (now, cpu))
    if (previous is None or now - previous[0] > _STALE_S) and wait:
        time.sleep(_FIRST_SAMPLE_S)
        return _metrics(sb, reg, wait=False)
    cpus = max(_number(status.cpus), 0.01)
    percent = 0.0
    if previous is not None and now > previous[0]:
        percent = min(100.0, max(0.0, (cpu - previous[1]) / (now - previous[0]) / cpus * 100))
    return {
        "cpu_count": cpus,
        "cpu_used_pct": round(percent, 2),
        "mem_total_mib": float(status.memory_mb),
        "mem_used_mib": round(_number(status.usage.memory_bytes) / (1 << 20), 2),
        "timestamp": int(time.time() * 1000),
    }


@router.get("/metrics", summary="CPU and memory of the sandbox, from its cgroup")
def metrics(ctx: Ctx, reg: Reg, id: SandboxId) -> dict[str, Any]:
    return _metrics(sandbox_of(ctx, id), reg, wait=True)


@router.get("/metrics/watch", summary="The metrics every second (at most 300 s)")
def watch_metrics(ctx: Ctx, reg: Reg, id: SandboxId) -> StreamingResponse:
    sb = sandbox_of(ctx, id)
    first = _metrics(sb, reg, wait=True)

    def lines() -> Iterator[bytes]:
        deadline = time.monotonic() + WATCH_MAX_S
        yield json.dumps(first).encode() + b"\n"
        while time.monotonic() + 1.0 <= deadline:
            time.sleep(1.0)
            try:
                sample = _metrics(sb, reg, wait=False)
            except SandboxError:
                return  # gone (destroyed, stopped): the watch ends
            yield json.dumps(sample).encode() + b"\n"

    return StreamingResponse(lines(), media_type=SSE_MEDIA_TYPE, headers=SSE_HEADERS)
