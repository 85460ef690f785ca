"""No module of the product over 600 lines (issue 36): one that grows past it is split along a seam of its
own (a coherent job per module), not trimmed. The runtime (``sandbox_rt``) and the PVE API test server
(``pve_testserver``) are held to it; tests and benchmarks are not."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("sandbox_rt", "pve_testserver")
MAX_LINES = 600


def _sizes() -> dict[str, int]:
    return {
        str(path.relative_to(REPO)): len(path.read_text().splitlines())
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
    }


def test_no_module_is_over_600_lines() -> None:
    over = {path: lines for path, lines in _sizes().items() if lines > MAX_LINES}
    assert over == {}, f"split these along a seam of their own: {over}"


def test_the_sizes_are_read() -> None:
    """The count sees both packages and real modules (else the check above would pass on nothing)."""
    sizes = _sizes()
    for package in PACKAGES:
        assert sum(1 for path in sizes if path.startswith(f"{package}/")) >= 20, package
    assert sizes["sandbox_rt/manager.py"] > 300
    assert max(sizes.values()) > MAX_LINES // 2
