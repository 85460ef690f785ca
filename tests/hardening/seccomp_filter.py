"""The seccomp filters a process really runs under, read from the kernel and evaluated on the host.

:func:`loaded_filters` takes the classic-BPF programs of a process with
``PTRACE_SECCOMP_GET_FILTER`` (host root: seize the process, interrupt it for the moment of the
read, detach); :func:`verdict` runs them on a system call as the kernel would (every filter of the
chain, the action of highest precedence wins). So a check can tell a refusal by the filter from one
by the kernel's own permission checks, which often answer with the same errno (EPERM).
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import os
import struct
from collections.abc import Sequence

AUDIT_ARCH_X86_64 = 0xC000003E

_PTRACE_DETACH = 17
_PTRACE_SEIZE = 0x4206
_PTRACE_INTERRUPT = 0x4207
_PTRACE_SECCOMP_GET_FILTER = 0x420C
_WALL = 0x40000000

# SECCOMP_RET_* actions, from the highest precedence to the lowest (include/uapi/linux/seccomp.h)
ACTIONS = {
    0x80000000: "kill_process",
    0x00000000: "kill_thread",
    0x00030000: "trap",
    0x00050000: "errno",
    0x7FC00000: "user_notif",
    0x7FF00000: "trace",
    0x7FFC0000: "log",
    0x7FFF0000: "allow",
}
_ACTION_MASK = 0xFFFF0000
_DATA_MASK = 0x0000FFFF

Insn = tuple[int, int, int, int]  # code, jt, jf, k


@dataclasses.dataclass(frozen=True)
class Verdict:
    action: str  # a value of ACTIONS
    data: int  # the errno for "errno"

    def __str__(self) -> str:
        if self.action == "errno":
            return f"errno {errno.errorcode.get(self.data, self.data)}"
        return self.action


class FilterReadError(RuntimeError):
    pass


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.restype = ctypes.c_long
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    return libc


def loaded_filters(pid: int) -> list[list[Insn]]:
    """Every seccomp filter of ``pid``, the most recently installed first (needs host root)."""
    libc = _libc()

    def ptrace(request: int, addr: int | None = None, data: object = None) -> int:
        ctypes.set_errno(0)
        ret = int(libc.ptrace(request, pid, addr, data))
        if ret < 0:
            err = ctypes.get_errno()
            raise FilterReadError(f"ptrace({request:#x}, {pid}): {os.strerror(err)}")
        return ret

    ptrace(_PTRACE_SEIZE)
    try:
        ptrace(_PTRACE_INTERRUPT)
        os.waitpid(pid, _WALL)
        programs: list[list[Insn]] = []
        for index in range(64):
            try:
                count = ptrace(_PTRACE_SECCOMP_GET_FILTER, index)
            except FilterReadError:
                if index == 0:
                    raise
                break  # ENOENT: no filter at this index, the chain is done
            buf = (ctypes.c_uint64 * count)()
            ptrace(_PTRACE_SECCOMP_GET_FILTER, index, buf)
            programs.append([_decode(raw) for raw in buf])
        return programs
    finally:
        libc.ptrace(_PTRACE_DETACH, pid, None, None)


def _decode(raw: int) -> Insn:
    code, jt, jf, k = struct.unpack("<HBBI", raw.to_bytes(8, "little"))
    return code, jt, jf, k


def seccomp_data(nr: int, args: Sequence[int], arch: int = AUDIT_ARCH_X86_64) -> bytes:
    """struct seccomp_data: nr, arch, instruction pointer, six 64-bit arguments."""
    full = [a & 0xFFFFFFFFFFFFFFFF for a in args] + [0] * (6 - len(args))
    return struct.pack("<iIQ6Q", nr, arch, 0, *full)


def run_program(program: Sequence[Insn], data: bytes) -> int:
    """Classic BPF as the kernel runs it for seccomp (the opcodes seccomp_check_filter allows)."""
    a = x = 0
    mem = [0] * 16
    pc = 0
    while pc < len(program):
        code, jt, jf, k = program[pc]
        pc += 1
        cls = code & 0x07
        if cls == 0x00:  # LD
            mode = code & 0xE0
            if mode == 0x20:  # ABS (W only)
                a = struct.unpack_from("<I", data, k)[0]
            elif mode == 0x00:  # IMM
                a = k
            elif mode == 0x60:  # MEM
                a = mem[k]
            elif mode == 0x80:  # LEN
                a = len(data)
            else:
                raise ValueError(f"unsupported LD {code:#x}")
        elif cls == 0x01:  # LDX
            mode = code & 0xE0
            x = k if mode == 0x00 else mem[k] if mode == 0x60 else len(data)
        elif cls == 0x02:  # ST
            mem[k] = a
        elif cls == 0x03:  # STX
            mem[k] = x
        elif cls == 0x04:  # ALU
            a = _alu(code, a, x if code & 0x08 else k)
        elif cls == 0x05:  # JMP
            op = code & 0xF0
            if op == 0x00:
                pc += k
                continue
            operand = x if code & 0x08 else k
            taken = {
                0x10: a == operand,
                0x20: a > operand,
                0x30: a >= operand,
                0x40: bool(a & operand),
            }[op]
            pc += jt if taken else jf
        elif cls == 0x06:  # RET
            rval = code & 0x18
            return a if rval == 0x10 else x if rval == 0x08 else k
        else:  # MISC
            if code & 0xF8 == 0x00:
                x = a  # TAX
            else:
                a = x  # TXA
    raise ValueError("the program fell off its end")


def _alu(code: int, a: int, operand: int) -> int:
    op = code & 0xF0
    ops = {
        0x00: lambda: a + operand,
        0x10: lambda: a - operand,
        0x20: lambda: a * operand,
        0x30: lambda: a // operand,
        0x40: lambda: a | operand,
        0x50: lambda: a & operand,
        0x60: lambda: a << operand,
        0x70: lambda: a >> operand,
        0x80: lambda: -a,
        0x90: lambda: a % operand,
        0xA0: lambda: a ^ operand,
    }
    return ops[op]() & 0xFFFFFFFF


def verdict(programs: Sequence[Sequence[Insn]], nr: int, args: Sequence[int]) -> Verdict:
    """What the filter chain answers to ``nr(args)``: the action of highest precedence."""
    data = seccomp_data(nr, args)
    best = None
    for program in programs:
        ret = run_program(program, data)
        action = ret & _ACTION_MASK
        # the kernel compares actions as signed 32-bit numbers: the smallest wins
        if best is None or _signed(action) < _signed(best & _ACTION_MASK):
            best = ret
    assert best is not None, "no filter"
    return Verdict(ACTIONS.get(best & _ACTION_MASK, hex(best & _ACTION_MASK)), best & _DATA_MASK)


def _signed(value: int) -> int:
    return value - (1 << 32) if value & 0x80000000 else value
