import ipaddress
import multiprocessing
import threading
from pathlib import Path

from sandbox_rt.ipam import IpPool, mac_for_ip


def _pool(tmp_path: Path) -> IpPool:
    return IpPool("10.99.1.0", "10.99.1.20", "10.99.0.0/16", tmp_path / "ipam.lock", reserved={"10.99.1.1"})


def test_lowest_free_address_skips_used_and_reserved(tmp_path: Path) -> None:
    pool = _pool(tmp_path)
    got: list[str] = []
    ip = pool.allocate(lambda: {"10.99.1.0", "10.99.1.2"}, got.append)
    assert ip == "10.99.1.3" and got == ["10.99.1.3"]


def test_exhausted_pool_raises_backend_error(tmp_path: Path) -> None:
    import pytest

    from sandbox_rt.errors import BackendError

    pool = IpPool("10.99.1.5", "10.99.1.6", "10.99.0.0/16", tmp_path / "l")
    with pytest.raises(BackendError, match="no free address"):
        pool.allocate(lambda: {"10.99.1.5", "10.99.1.6"}, lambda ip: None)


def test_threads_never_share_an_address(tmp_path: Path) -> None:
    pool = _pool(tmp_path)
    taken: set[str] = set()
    results: list[str] = []

    def worker() -> None:
        results.append(pool.allocate(lambda: set(taken), taken.add))

    threads = [threading.Thread(target=worker) for _ in range(15)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 15 and len(set(results)) == 15


def _proc_alloc(lock: str, registry: str, n: int) -> None:
    pool = IpPool("10.99.1.0", "10.99.1.200", "10.99.0.0/16", Path(lock))
    reg = Path(registry)

    def used() -> set[str]:
        return set(reg.read_text().split()) if reg.exists() else set()

    def commit(ip: str) -> None:
        with reg.open("a") as fh:
            fh.write(ip + "\n")

    for _ in range(n):
        pool.allocate(used, commit)


def test_processes_never_share_an_address(tmp_path: Path) -> None:
    reg = tmp_path / "registry"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_proc_alloc, args=(str(tmp_path / "l"), str(reg), 10)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    ips = reg.read_text().split()
    assert len(ips) == 40 and len(set(ips)) == 40


def test_mac_is_stable_and_locally_administered() -> None:
    mac = mac_for_ip("10.99.1.2")
    assert mac == mac_for_ip("10.99.1.2") == "02:5b:0a:63:01:02"
    assert int(mac.split(":")[0], 16) & 0b10
    assert mac != mac_for_ip(str(ipaddress.IPv4Address("10.99.1.3")))
