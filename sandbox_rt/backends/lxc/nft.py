"""The per-sandbox internet toggle on the host: an element in the nft set ``internet_allowed``."""

from __future__ import annotations

import ipaddress
import json
import subprocess

from ...errors import BackendError

__all__ = ["NftInternetSet", "run_nft"]


def run_nft(
    *args: str,
    table: str,
    step: str,
    check: bool = True,
    script: str | None = None,
    timeout: float = 10,
) -> subprocess.CompletedProcess[str]:
    """``nft args...`` (``script`` on stdin, for ``-f -``); a missing tool, or with ``check`` a
    failure, is a ``BackendError`` of ``step`` that names ``table`` (``<family> <name>``)."""
    try:
        proc = subprocess.run(["nft", *args], input=script, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as exc:
        raise BackendError("the nft tool is not installed (run site.yml)", step=step) from exc
    if check and proc.returncode != 0:
        raise BackendError(
            f"nft {' '.join(args)} failed (is table {table} loaded? run site.yml)",
            step=step,
            detail=proc.stderr,
        )
    return proc


class NftInternetSet:
    """Add and remove sandbox addresses in ``<family> <table> <set>`` with the ``nft`` tool."""

    def __init__(
        self, family: str = "inet", table: str = "sandbox", set_name: str = "internet_allowed"
    ) -> None:
        self.family = family
        self.table = table
        self.set_name = set_name

    def _nft(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run_nft(*args, table=f"{self.family} {self.table}", step="internet", check=check)

    def add(self, ip: str) -> None:
        addr = ipaddress.IPv4Address(ip)
        self._nft("add", "element", self.family, self.table, self.set_name, f"{{ {addr} }}")

    def remove(self, ip: str) -> bool:
        """Remove ``ip``; absent is fine (idempotent). True if it was in the set."""
        addr = ipaddress.IPv4Address(ip)
        if str(addr) not in self.members():
            return False
        proc = self._nft(
            "delete", "element", self.family, self.table, self.set_name, f"{{ {addr} }}", check=False
        )
        if proc.returncode != 0 and str(addr) in self.members():
            raise BackendError(
                f"cannot remove {addr} from {self.set_name}", step="internet", detail=proc.stderr
            )
        return True

    def members(self) -> set[str]:
        proc = self._nft("-j", "list", "set", self.family, self.table, self.set_name)
        try:
            doc = json.loads(proc.stdout)
        except ValueError as exc:
            raise BackendError("nft -j printed no JSON", step="internet", detail=proc.stdout) from exc
        out: set[str] = set()
        for item in doc.get("nftables", []):
            for elem in item.get("set", {}).get("elem", []) or []:
                if isinstance(elem, str):
                    out.add(elem)
                elif isinstance(elem, dict) and "elem" in elem:
                    val = elem["elem"].get("val")
                    if isinstance(val, str):
                        out.add(val)
        return out

    def contains(self, ip: str) -> bool:
        return str(ipaddress.IPv4Address(ip)) in self.members()
