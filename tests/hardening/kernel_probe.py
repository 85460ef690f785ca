"""Kernel-surface probes run inside a sandbox (Debian's python3, standard library only).

    python3 kernel_probe.py FAMILY ...   {"filters": n, "FAMILY": {"call": {"ret", "errno", "nr", "args"}}}
    python3 kernel_probe.py --list       {"FAMILY": ["call", ...], ...}

Each call is made once with raw ``syscall(2)`` (x86_64 numbers), in a fresh child process of its
own (a call that succeeds, e.g. unshare, cannot change what the next one sees), with arguments
chosen so that the kernel, had the seccomp filter let the call through, would answer something other
than the filter's errno where it can (``setns(-1)`` -> EBADF, ``mount`` on a missing path ->
ENOENT, ``clock_settime`` with an invalid time -> EINVAL, ``kcmp`` on itself -> 0). ``nr`` and
``args`` are the exact values passed, so the host can run the sandbox's loaded filter on the same
call (tests/hardening/seccomp_filter.py). ``filters`` is the probe's own ``Seccomp_filters`` count.
Whatever a call creates (a child, a file descriptor) is reaped or closed at once. Prints one JSON
line and exits 0.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import sys
from collections.abc import Callable
from typing import Any

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

# x86_64 system call numbers (arch/x86/entry/syscalls/syscall_64.tbl)
NR = {
    "clone": 56, "unshare": 272, "clone3": 435, "setns": 308,
    "keyctl": 250, "add_key": 248, "request_key": 249,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "userfaultfd": 323, "bpf": 321, "perf_event_open": 298,
    "mount": 165, "umount2": 166, "pivot_root": 155, "open_tree": 428, "move_mount": 429,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
    "settimeofday": 164, "clock_settime": 227,
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
    "pidfd_open": 434, "pidfd_getfd": 438, "process_madvise": 440,
    "init_module": 175, "finit_module": 313, "delete_module": 176,
    "reboot": 169, "kexec_load": 246, "kexec_file_load": 320,
    "swapon": 167, "swapoff": 168, "acct": 163, "quotactl": 179, "syslog": 103,
    "sethostname": 170, "setdomainname": 171, "open_by_handle_at": 304, "iopl": 172, "ioperm": 173,
    "lookup_dcookie": 212, "fanotify_init": 300, "mbind": 237, "set_mempolicy": 238,
    "get_mempolicy": 239, "socket": 41,
}  # fmt: skip

CLONE_NEWUSER = 0x10000000
CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
SIGCHLD = 17
AT_FDCWD = -100
MISSING = b"/nonexistent-kernel-probe"

Result = tuple[int, int]
_U64 = (1 << 64) - 1
CALLED: list[tuple[int, list[int]]] = []  # (nr, args) of the calls made in this process


def _word(arg: object, keep: list[object]) -> int:
    """A syscall argument as the 64-bit value the kernel sees (buffers kept alive in ``keep``)."""
    if arg is None:
        return 0
    if isinstance(arg, int):
        return arg & _U64
    if isinstance(arg, bytes):
        buf = ctypes.create_string_buffer(arg)
        keep.append(buf)
        return ctypes.addressof(buf)
    if isinstance(arg, ctypes.Array):
        keep.append(arg)
        return ctypes.addressof(arg)
    raise TypeError(f"unsupported syscall argument {arg!r}")


def sys_call(name: str, *args: object) -> Result:
    """The raw call; (return value, errno) with errno 0 on success."""
    keep: list[object] = []
    words = [_word(a, keep) for a in args]
    CALLED.append((NR[name], words))
    signed = [w - (1 << 64) if w >> 63 else w for w in words]
    ctypes.set_errno(0)
    ret = int(libc.syscall(ctypes.c_long(NR[name]), *(ctypes.c_long(w) for w in signed)))
    return (ret, ctypes.get_errno() if ret == -1 else 0)


def _close(result: Result) -> Result:
    """For calls that return a file descriptor: close it."""
    if result[0] >= 0 and result[1] == 0:
        os.close(result[0])
    return result


def _child(result: Result) -> Result:
    """For fork-like calls: the child (ret 0) leaves at once, the parent reaps it."""
    if result[0] == 0 and result[1] == 0:
        os._exit(0)
    if result[0] > 0:
        os.waitpid(result[0], 0)
    return result


def _clone3(flags: int) -> Result:
    # struct clone_args (v0, 64 bytes): flags, pidfd, child_tid, parent_tid, exit_signal, stack, ...
    args = (ctypes.c_uint64 * 8)(flags, 0, 0, 0, SIGCHLD, 0, 0, 0)
    return _child(sys_call("clone3", args, 64))


def _iov(buf: ctypes.Array[ctypes.c_char]) -> ctypes.Array[ctypes.c_uint64]:
    return (ctypes.c_uint64 * 2)(ctypes.addressof(buf), len(buf))


def _process_vm(name: str) -> Result:
    src, dst = ctypes.create_string_buffer(b"probe", 8), ctypes.create_string_buffer(8)
    local, remote = (_iov(dst), _iov(src)) if name.endswith("readv") else (_iov(src), _iov(dst))
    return sys_call(name, os.getpid(), local, 1, remote, 1, 0)


def _with_pidfd(call: Callable[[int], Result]) -> Result:
    pidfd = sys_call("pidfd_open", os.getpid(), 0)
    CALLED.pop()  # a helper call (allowed), not the one probed
    assert pidfd[1] == 0, f"pidfd_open failed: {pidfd}"
    try:
        return call(pidfd[0])
    finally:
        os.close(pidfd[0])


def _process_madvise(pidfd: int) -> Result:
    page = ctypes.create_string_buffer(4096)
    return sys_call("process_madvise", pidfd, _iov(page), 1, 20, 0)  # MADV_COLD


def _bad_time() -> ctypes.Array[ctypes.c_long]:
    return (ctypes.c_long * 2)(0, -1)  # tv_nsec / tv_usec out of range: EINVAL from the kernel


def _socket(family: int, kind: int) -> Result:
    return _close(sys_call("socket", family, kind, 0))


# family -> call -> thunk. The userns family is also the second lock's (user.max_user_namespaces).
FAMILIES: dict[str, dict[str, Callable[[], Result]]] = {
    "userns": {
        "unshare(CLONE_NEWUSER)": lambda: sys_call("unshare", CLONE_NEWUSER),
        "clone(CLONE_NEWUSER)": lambda: _child(sys_call("clone", CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)),
        "clone3(CLONE_NEWUSER)": lambda: _clone3(CLONE_NEWUSER),
        "clone3()": lambda: _clone3(0),
    },
    "setns": {
        "setns(-1)": lambda: sys_call("setns", -1, 0),
        "unshare(CLONE_NEWNS)": lambda: sys_call("unshare", CLONE_NEWNS),
        "unshare(CLONE_NEWNET)": lambda: sys_call("unshare", CLONE_NEWNET),
        "clone(CLONE_NEWNET)": lambda: _child(sys_call("clone", CLONE_NEWNET | SIGCHLD, 0, 0, 0, 0)),
    },
    "keyring": {
        "keyctl(GET_KEYRING_ID)": lambda: sys_call("keyctl", 0, -3, 0),  # session keyring, no create
        "add_key": lambda: sys_call("add_key", b"user", b"kernel-probe", b"x", 1, -2),  # process keyring
        "request_key": lambda: sys_call("request_key", b"user", b"kernel-probe-missing", None, 0),
    },
    "io_uring": {
        "io_uring_setup": lambda: _close(sys_call("io_uring_setup", 1, ctypes.create_string_buffer(120))),
        "io_uring_enter": lambda: sys_call("io_uring_enter", -1, 0, 0, 0, None, 0),
        "io_uring_register": lambda: sys_call("io_uring_register", -1, 0, None, 0),
    },
    "userfaultfd": {
        "userfaultfd(USER_MODE_ONLY)": lambda: _close(sys_call("userfaultfd", os.O_CLOEXEC | 1)),
    },
    "bpf": {
        "bpf(unknown cmd)": lambda: sys_call("bpf", 1000, None, 0),
    },
    "perf_event_open": {
        "perf_event_open(NULL)": lambda: sys_call("perf_event_open", None, 0, -1, -1, 0),
    },
    "mount": {
        "mount(tmpfs, missing dir)": lambda: sys_call("mount", b"none", MISSING, b"tmpfs", 0, None),
        "umount2(bad flags)": lambda: sys_call("umount2", b"/", 0x80000000),
        "pivot_root(missing)": lambda: sys_call("pivot_root", MISSING, MISSING),
        "open_tree(bad flags)": lambda: _close(sys_call("open_tree", AT_FDCWD, b"/", 0x80000000)),
        "move_mount(bad flags)": lambda: sys_call("move_mount", -1, b"", -1, b"", 0x80000000),
        "fsopen(bad fs)": lambda: _close(sys_call("fsopen", b"kernel-probe-fs", 0)),
        "fsconfig(-1)": lambda: sys_call("fsconfig", -1, 0, None, None, 0),
        "fsmount(-1)": lambda: sys_call("fsmount", -1, 0, 0),
        "fspick(missing)": lambda: _close(sys_call("fspick", AT_FDCWD, MISSING, 0)),
        "mount_setattr(bad flags)": lambda: sys_call("mount_setattr", -1, b"", 0x80000000, None, 0),
    },
    "clock": {
        "settimeofday(invalid)": lambda: sys_call("settimeofday", _bad_time(), None),
        "clock_settime(invalid)": lambda: sys_call("clock_settime", 0, _bad_time()),
    },
    "ptrace": {
        "ptrace(GETREGS self)": lambda: sys_call("ptrace", 12, os.getpid(), None, None),
        "process_vm_readv(self)": lambda: _process_vm("process_vm_readv"),
        "process_vm_writev(self)": lambda: _process_vm("process_vm_writev"),
        "kcmp(self)": lambda: sys_call("kcmp", os.getpid(), os.getpid(), 0, 0, 0),
        "pidfd_getfd(self)": lambda: _with_pidfd(lambda fd: _close(sys_call("pidfd_getfd", fd, 0, 0))),
        "process_madvise(self)": lambda: _with_pidfd(_process_madvise),
    },
    "module": {
        "init_module": lambda: sys_call("init_module", b"", 0, b""),
        "finit_module(-1)": lambda: sys_call("finit_module", -1, b"", 0),
        "delete_module": lambda: sys_call("delete_module", b"kernel_probe_missing", 0),
    },
    "reboot": {
        "reboot(bad magic)": lambda: sys_call("reboot", 0, 0, 0, None),
        "kexec_load": lambda: sys_call("kexec_load", 0, 0, None, 0),
        "kexec_file_load(-1)": lambda: sys_call("kexec_file_load", -1, -1, 0, None, 0),
    },
    "admin": {
        "swapon(missing)": lambda: sys_call("swapon", MISSING, 0),
        "swapoff(missing)": lambda: sys_call("swapoff", MISSING),
        "acct(missing)": lambda: sys_call("acct", MISSING),
        "quotactl(bad cmd)": lambda: sys_call("quotactl", 0, None, 0, None),
        "syslog(SIZE_BUFFER)": lambda: sys_call("syslog", 10, None, 0),
        "sethostname": lambda: sys_call("sethostname", b"probe", 5),
        "setdomainname": lambda: sys_call("setdomainname", b"probe", 5),
        "open_by_handle_at(-1)": lambda: sys_call("open_by_handle_at", -1, None, 0),
        "iopl(0)": lambda: sys_call("iopl", 0),
        "ioperm(0)": lambda: sys_call("ioperm", 0, 0, 0),
        "lookup_dcookie": lambda: sys_call("lookup_dcookie", 0, None, 0),
        "fanotify_init": lambda: _close(sys_call("fanotify_init", 0, 0)),
        "get_mempolicy": lambda: sys_call("get_mempolicy", None, None, 0, None, 0),
        "set_mempolicy(DEFAULT)": lambda: sys_call("set_mempolicy", 0, None, 0),
        "mbind(0 bytes)": lambda: sys_call("mbind", None, 0, 0, None, 0, 0),
        "socket(AF_ALG)": lambda: _socket(38, 5),
        "socket(AF_VSOCK)": lambda: _socket(40, 1),
    },
}


def isolated(call: Callable[[], Result]) -> dict[str, Any]:
    """Run ``call`` in a fresh child process: {"ret", "errno", "nr", "args"}."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one call, its answer on the pipe, out
        try:
            os.close(read_end)
            ret, err = call()
            nr, args = CALLED[-1]
            out = {"ret": ret, "errno": err, "nr": nr, "args": args}
        except BaseException as exc:
            out = {"error": repr(exc)}
        os.write(write_end, json.dumps(out).encode())
        os._exit(0)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    os.waitpid(pid, 0)
    result: dict[str, Any] = json.loads(b"".join(chunks) or b'{"error": "the child died"}')
    return result


def seccomp_filters() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Seccomp_filters:"):
                return int(line.split()[1])
    return -1


def run(families: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"filters": seccomp_filters()}
    for family in families:
        out[family] = {name: isolated(call) for name, call in FAMILIES[family].items()}
    return out


def main(argv: list[str]) -> int:
    if argv == ["--list"]:
        print(json.dumps({f: list(calls) for f, calls in FAMILIES.items()}))
        return 0
    if platform.machine() != "x86_64":
        print(json.dumps({"error": f"no syscall table for {platform.machine()}"}))
        return 0
    unknown = [f for f in argv if f not in FAMILIES]
    if unknown or not argv:
        print(json.dumps({"error": f"unknown families {unknown}; known: {sorted(FAMILIES)}"}))
        return 0
    print(json.dumps(run(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
