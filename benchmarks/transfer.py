"""File transfer throughput: ``Sandbox.upload``/``download`` vs OpenSSH ``sftp -b`` and ``scp``.

One sandbox, one file of random bytes (100 MB; 20 MB with --quick) on the host. OpenSSH uses the
runtime's key and user, the pinned host key and a ControlMaster opened before timing, so neither
side pays a connection set-up (the runtime keeps its connection too). ``scp`` of OpenSSH >= 9.0
speaks the SFTP protocol. Each round moves the file up and down once per tool; every download is
checked against the source's SHA-256. Throughput = size / median duration (MB = 2**20 bytes).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .context import Bench
from .raw import OpenSSH
from .stats import compare, summary, throughput, timed

__all__ = ["run"]

WHAT = {
    "upload_sandbox": "Sandbox.upload(file) (paramiko SFTP)",
    "raw_sftp_upload": "OpenSSH sftp -b 'put' (ControlMaster)",
    "raw_scp_upload": "OpenSSH scp to the sandbox (ControlMaster)",
    "download_sandbox": "Sandbox.download(file) (paramiko SFTP)",
    "raw_sftp_download": "OpenSSH sftp -b 'get' (ControlMaster)",
    "raw_scp_download": "OpenSSH scp from the sandbox (ControlMaster)",
}
REMOTE = "/home/sandbox"


def _random_file(path: Path, megabytes: int) -> str:
    digest = hashlib.sha256()
    with path.open("wb") as fh:
        for _ in range(megabytes):
            chunk = os.urandom(1 << 20)
            digest.update(chunk)
            fh.write(chunk)
    return digest.hexdigest()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _ok(cmd: list[str]) -> Callable[[], object]:
    return lambda: subprocess.run(cmd, check=True, capture_output=True)


def run(b: Bench) -> dict[str, Any]:
    mb = b.opts.transfer_mb
    work = b.tmp / "transfer"
    work.mkdir()
    src = work / "source.bin"
    expected = _random_file(src, mb)
    res: dict[str, list[float]] = {k: [] for k in WHAT}
    verified: dict[str, bool] = {}
    try:
        with b.sandbox(memory_mb=max(b.opts.memory_mb, 1024)) as sb:
            ossh = OpenSSH(sb.ip, sb.record.host_key, b.settings.ssh_key, b.settings.ssh_user, work / "ssh")
            local = {k: work / f"{k}.bin" for k in ("sandbox", "sftp", "scp")}
            remote = {k: f"{REMOTE}/bench-{k}.bin" for k in ("sandbox", "sftp", "scp")}
            steps: list[tuple[str, Callable[[], object]]] = [
                ("upload_sandbox", lambda: sb.upload(src, remote["sandbox"])),
                ("raw_sftp_upload", _ok(ossh.sftp_batch([f"put {src} {remote['sftp']}"]))),
                ("raw_scp_upload", _ok(ossh.scp(str(src), ossh.remote(remote["scp"])))),
                ("download_sandbox", lambda: sb.download(remote["sandbox"], local["sandbox"])),
                ("raw_sftp_download", _ok(ossh.sftp_batch([f"get {remote['sftp']} {local['sftp']}"]))),
                ("raw_scp_download", _ok(ossh.scp(ossh.remote(remote["scp"]), str(local["scp"])))),
            ]
            with ossh.master():
                for round_ in range(b.opts.runs + 1):  # round 0 warms caches and is not counted
                    for name, step in steps:
                        b.checkpoint()
                        t = timed(step)
                        if round_:
                            res[name].append(t)
                    if round_ == 0:
                        verified = {k: _sha256(p) == expected for k, p in local.items()}
                    for p in local.values():
                        p.unlink()
    finally:
        for p in work.glob("*.bin"):
            p.unlink()
    measures = {k: throughput(summary(v, WHAT[k], raw=k.startswith("raw_")), mb) for k, v in res.items()}
    comparisons = [
        compare(measures, "upload_sandbox", "raw_sftp_upload", "throughput"),
        compare(measures, "upload_sandbox", "raw_scp_upload", "throughput"),
        compare(measures, "download_sandbox", "raw_sftp_download", "throughput"),
        compare(measures, "download_sandbox", "raw_scp_download", "throughput"),
    ]
    facts = {
        "megabytes": mb,
        "sha256_verified": verified,
        "all_verified": bool(verified) and all(verified.values()),
    }
    return {"measures": measures, "comparisons": comparisons, "facts": facts}
