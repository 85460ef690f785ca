from sandbox_rt.backends.lxc import cgroup_limit_lines
from sandbox_rt.validation import make_spec


def test_v1_lines_bound_memory_swap_pids_and_cpu() -> None:
    spec = make_spec(cpus=1.5, memory_mb=256, pids_max=300, host_cpus=2)
    lines = cgroup_limit_lines(spec, v1=True, memsw=True)
    assert "lxc.cgroup.memory.limit_in_bytes = 268435456" in lines
    assert "lxc.cgroup.memory.memsw.limit_in_bytes = 268435456" in lines  # swap 0
    assert "lxc.cgroup.pids.max = 300" in lines
    assert "lxc.cgroup.cpu.cfs_quota_us = 150000" in lines


def test_v2_lines() -> None:
    spec = make_spec(cpus=0.5, memory_mb=128, pids_max=64, host_cpus=2)
    lines = cgroup_limit_lines(spec, v1=False, memsw=False)
    assert lines == [
        "lxc.cgroup2.memory.max = 134217728",
        "lxc.cgroup2.memory.swap.max = 0",
        "lxc.cgroup2.pids.max = 64",
        "lxc.cgroup2.cpu.max = 50000 100000",
    ]
