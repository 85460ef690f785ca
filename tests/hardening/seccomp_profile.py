"""sandbox_rt's seccomp profile: the requirements ``roles/template_build/files/sandbox.seccomp`` is
checked against, its section in docs/controls.md, and a developer's audit against moby's profile.

The profile file is the source of truth, written by hand in LXC's seccomp v2 syntax: an allowlist
whose default answer is ENOSYS, with every call we refuse named with EPERM, so ENOSYS is left to
calls the profile does not know (clone3, calls newer than the profile), which makes libc fall back
(clone3 -> clone) as runc does for moby's profile. This module parses it and holds our own
requirements, written here and not derived from anyone's file:

* :data:`MUST_REFUSE`: every call the profile refuses, by family, with the errno we require;
* :data:`CONDITIONAL`: the calls allowed only with some arguments (clone without namespace flags,
  socket without AF_ALG/AF_VSOCK, personality with five values), rule by rule;
* the documented differences from moby's default profile (:data:`STRICTER`,
  :data:`UNRESOLVED_BY_LIBSECCOMP_2_5_4`, :data:`DEFAULT_DIFFERENCE`, :data:`ARGUMENT_DIFFERENCES`),
  rendered into docs/controls.md by :func:`render_markdown`.

:func:`check_profile` raises :class:`ProfileError` when the file breaks one of them;
tests/unit/test_seccomp_profile.py runs it (and ``python -m tests.hardening.seccomp_profile`` does).

Audit against moby (developers, by hand; moby's file is never committed or read by the tests).
The profile was audited against moby/profiles ``seccomp/default.json`` at commit cd3bed8061c7,
evaluated as moby does for a container with Docker's default capabilities (no CAP_SYS_ADMIN,
CAP_SYS_PTRACE, CAP_BPF, ...) on amd64 and its x86/x32 compat arches on a kernel >= 4.8::

    git clone https://github.com/moby/profiles /tmp/moby-profiles
    git -C /tmp/moby-profiles checkout cd3bed8061c7   # or a newer commit, to audit it
    python -m tests.hardening.seccomp_profile --compare /tmp/moby-profiles/seccomp/default.json

It prints every difference (calls moby allows that we refuse or do not name, calls we allow that
moby refuses, argument rules that differ, the default answers) and exits 0 when they are exactly
the documented ones, 1 otherwise: then decide each new difference by hand, edit the profile and the
constants here with the reason, and regenerate docs/controls.md (``python -m tests.hardening.controls``).
The libseccomp row is not moby's: tests/unit/test_seccomp_profile.py checks it on the host.

LXC rule syntax (LXC 5.0.2, src/lxc/seccomp.c): ``name [action] [arg]...``, an argument being
``[index,value,op]`` or, for SCMP_CMP_MASKED_EQ, ``[index,value,SCMP_CMP_MASKED_EQ,mask]`` meaning
``(arg & mask) == value``. Note the order: moby's ``{"value": 2114060288, "op": "MASKED_EQ"}`` on
clone becomes ``[0,0,SCMP_CMP_MASKED_EQ,2114060288]``; written ``[0,2114060288,...,0]`` LXC loads a
mask of 0 and libseccomp makes the rule match every clone, namespace flags included (measured).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PROFILE_FILE = REPO / "roles" / "template_build" / "files" / "sandbox.seccomp"
MOBY_AUDITED = "moby/profiles `seccomp/default.json`, commit cd3bed8061c7 (2026-06-30)"
COMPARE = "python -m tests.hardening.seccomp_profile --compare PATH/TO/moby/profiles/seccomp/default.json"

EPERM = 1
ENOSYS = 38
ERRNO_NAMES = {EPERM: "EPERM", ENOSYS: "ENOSYS"}
POLICY = f"allowlist errno {ENOSYS}"


class ProfileError(AssertionError):
    """The profile file breaks one of the requirements of this module."""


# -- our requirements -------------------------------------------------------------------------------
# Every call the profile refuses whatever its arguments, by family, with the errno we require. An
# errno equal to the profile's default (ENOSYS) means "not named": libseccomp refuses a rule equal to
# the default. The families of tests/hardening/kernel_probe.py are probed in real sandboxes.
_P = EPERM
MUST_REFUSE: dict[str, dict[str, int]] = {
    "userns": {"unshare": _P, "clone3": ENOSYS},  # clone with CLONE_NEWUSER: CONDITIONAL
    "setns": {"setns": _P, "unshare": _P},  # clone with a namespace flag: CONDITIONAL
    "keyring": {"keyctl": _P, "add_key": _P, "request_key": _P},
    "io_uring": {"io_uring_setup": _P, "io_uring_enter": _P, "io_uring_register": _P},
    "userfaultfd": {"userfaultfd": _P},
    "bpf": {"bpf": _P},
    "perf_event_open": {"perf_event_open": _P},
    "mount": {
        "mount": _P, "umount": _P, "umount2": _P, "pivot_root": _P, "open_tree": _P, "move_mount": _P,
        "fsopen": _P, "fsconfig": _P, "fsmount": _P, "fspick": _P, "mount_setattr": _P,
    },
    "clock": {"settimeofday": _P, "stime": _P, "clock_settime": _P, "clock_settime64": _P},
    "ptrace": {
        "ptrace": _P, "process_vm_readv": _P, "process_vm_writev": _P, "kcmp": _P, "pidfd_getfd": _P,
        "process_madvise": _P,
    },
    "module": {
        "init_module": _P, "finit_module": _P, "delete_module": _P, "create_module": _P,
        "query_module": _P, "get_kernel_syms": _P,
    },
    "reboot": {"reboot": _P, "kexec_load": _P, "kexec_file_load": _P},
    "admin": {  # socket(AF_ALG / AF_VSOCK): CONDITIONAL
        "swapon": _P, "swapoff": _P, "acct": _P, "quotactl": _P, "quotactl_fd": _P, "syslog": _P,
        "sethostname": _P, "setdomainname": _P, "open_by_handle_at": _P, "iopl": _P, "ioperm": _P,
        "lookup_dcookie": _P, "fanotify_init": _P, "vhangup": _P, "get_mempolicy": _P,
        "set_mempolicy": _P, "set_mempolicy_home_node": _P, "mbind": _P, "migrate_pages": _P,
        "move_pages": _P,
    },
    # not probed: no control of their own
    "lsm": {"lsm_get_self_attr": _P, "lsm_set_self_attr": _P, "lsm_list_modules": _P},
    "obsolete": {  # removed from Linux or never implemented on x86_64; refused, not ENOSYS
        "_sysctl": _P, "sysfs": _P, "ustat": _P, "uselib": _P, "nfsservctl": _P, "afs_syscall": _P,
        "getpmsg": _P, "putpmsg": _P, "security": _P, "tuxcall": _P, "vserver": _P,
    },
}  # fmt: skip
UNPROBED_FAMILIES = ("lsm", "obsolete")

# clone/unshare flags that make a namespace (moby's 2114060288 = their union)
NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
NAMESPACE_MASK = sum(NAMESPACE_FLAGS.values())
AF_ALG, AF_VSOCK = 38, 40
# PER_LINUX, PER_LINUX32, UNAME26, PER_LINUX32 | UNAME26, and 0xffffffff (query the persona)
PERSONALITY_VALUES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
# The calls allowed only with some arguments: exactly these LXC rule lines, in this order.
CONDITIONAL: dict[str, tuple[str, ...]] = {
    # allowed when (flags & mask) == 0, in LXC's order [index,value,MASKED_EQ,mask]; EPERM per flag
    "clone": (
        f"allow [0,0,SCMP_CMP_MASKED_EQ,{NAMESPACE_MASK}]",
        *(f"errno {EPERM} [0,{f},SCMP_CMP_MASKED_EQ,{f}]" for f in NAMESPACE_FLAGS.values()),
    ),
    # every address family but AF_ALG (38) and AF_VSOCK (40), which are EPERM
    "socket": (
        f"allow [0,{AF_ALG},SCMP_CMP_LT]",
        f"allow [0,{AF_ALG + 1},SCMP_CMP_EQ]",
        f"allow [0,{AF_VSOCK},SCMP_CMP_GT]",
        f"errno {EPERM} [0,{AF_ALG},SCMP_CMP_EQ]",
        f"errno {EPERM} [0,{AF_VSOCK},SCMP_CMP_EQ]",
    ),
    # the five values only; other values get the default (ENOSYS)
    "personality": tuple(f"allow [0,{v},SCMP_CMP_EQ]" for v in PERSONALITY_VALUES),
}


# -- the documented differences from moby (audited: MOBY_AUDITED) -----------------------------------
@dataclasses.dataclass(frozen=True)
class Difference:
    calls: str  # the table's first column
    moby: str  # moby's answer (default capabilities, amd64/x86/x32)
    ours: str  # the profile's answer
    why: str


# What moby allows and we refuse (EPERM), and why.
STRICTER: dict[str, str] = {
    "process_vm_readv": "moby pairs it with ptrace (same rule); refused with it",
    "process_vm_writev": "moby pairs it with ptrace (same rule); refused with it",
    "ptrace": (
        "moby allows ptrace on kernels >= 4.8 (the seccomp bypass through ptrace is fixed there). A "
        "sandbox runs one user's code with no debugger in the template, so the call's own history "
        "(e.g. CVE-2019-13272, PTRACE_TRACEME) weighs more than strace/gdb inside a sandbox"
    ),
}
# Names in the allow list (as in moby's) that LXC 5.0.2's libseccomp (2.5.4, Debian 12) cannot resolve
# on x86_64, x86 or x32 (newer than Linux 6.7): LXC logs "undefined on host native arch" and adds no
# rule, so they get ENOSYS. They stay: a newer libseccomp resolves and allows them, as moby means.
UNRESOLVED_BY_LIBSECCOMP_2_5_4 = (
    "getxattrat", "listmount", "listxattrat", "mseal", "removexattrat", "setxattrat", "statmount",
    "uretprobe",
)  # fmt: skip
UNRESOLVED_WHY = (
    "in the profile's allow list as in moby's, but libseccomp 2.5.4 (Debian 12) cannot resolve these "
    "names (Linux >= 6.8 calls), so LXC adds no rule and they get the default. Debian 12's glibc "
    "and Python do not use them; with a newer libseccomp they are allowed"
)
# Names in the allow list (as in moby's main list) that no x86 arch has (LXC skips them).
OTHER_ARCH_NAMES = ("recv", "riscv_hwprobe", "send")
DEFAULT_DIFFERENCE = Difference(
    "calls neither profile names",
    "EPERM",
    "ENOSYS",
    "new calls and x86-only relics such as vm86. Programs probe new calls and fall back on ENOSYS only "
    "(glibc's clone3 -> clone); EPERM would break them (runc too answers ENOSYS for calls newer than "
    "moby's profile, whose default is EPERM)",
)
ARGUMENT_DIFFERENCES = (
    Difference(
        "personality with other arguments",
        "EPERM",
        "ENOSYS",
        "LXC rules cannot say 'none of these values'; both allow the same five values and refuse the others",
    ),
)


UNRESOLVED_DIFFERENCE = Difference(
    ", ".join(UNRESOLVED_BY_LIBSECCOMP_2_5_4), "allowed", "ENOSYS on LXC 5.0.2 / libseccomp 2.5.4",
    UNRESOLVED_WHY,
)  # fmt: skip


def documented_differences() -> list[Difference]:
    """The differences from moby we wrote down, in the table's order."""
    stricter = [Difference(name, "allowed", "EPERM", why) for name, why in STRICTER.items()]
    return [*stricter, UNRESOLVED_DIFFERENCE, DEFAULT_DIFFERENCE, *ARGUMENT_DIFFERENCES]


def documented_moby_differences() -> set[tuple[str, str, str]]:
    """(calls, moby, ours) of the rows :func:`compare` must find: all but the libseccomp one, which
    is this host's libseccomp's, not moby's file's."""
    return {(d.calls, d.moby, d.ours) for d in documented_differences() if d != UNRESOLVED_DIFFERENCE}


# -- the profile file -------------------------------------------------------------------------------
def parse_lxc_profile(text: str) -> tuple[str, dict[str, list[str]]]:
    """(the policy line, {call: [the rest of each rule line]}) of a v2 profile."""
    lines = text.splitlines()
    if not lines or lines[0] != "2":
        raise ProfileError("not an LXC seccomp v2 profile (first line is not '2')")
    rules: dict[str, list[str]] = {}
    for line in lines[2:]:
        if not line.strip() or line.startswith(("#", "[")):
            continue
        name, _, rest = line.partition(" ")
        rules.setdefault(name, []).append(rest.strip())
    return lines[1], rules


def default_errno(policy: str) -> int:
    m = re.fullmatch(r"allowlist errno (\d+)", policy)
    if m is None:
        raise ProfileError(f"the policy is {policy!r}, not an allowlist with an errno default")
    return int(m.group(1))


def answer(policy: str, rules: dict[str, list[str]], name: str) -> str:
    """What the profile answers ``name`` whatever its arguments: allowed, an errno name, or
    'conditional' (it depends on the arguments)."""
    got = rules.get(name)
    if got is None:
        return _errname(default_errno(policy))
    if got == [""]:
        return "allowed"
    m = re.fullmatch(r"errno (\d+)", got[0])
    if len(got) == 1 and m:
        return _errname(int(m.group(1)))
    return "conditional"


def _errname(n: int) -> str:
    return ERRNO_NAMES.get(n, f"errno {n}")


def check_profile(text: str | None = None) -> None:
    """Raise :class:`ProfileError` unless the profile meets every requirement of this module."""
    text = PROFILE_FILE.read_text() if text is None else text
    policy, rules = parse_lxc_profile(text)
    if policy != POLICY:
        raise ProfileError(f"the policy is {policy!r}, not {POLICY!r}")
    for name, got in rules.items():
        for rule in got:
            if not re.fullmatch(r"|errno \d+|(allow|errno \d+)( \[\d+,\d+,SCMP_CMP_[A-Z_]+(,\d+)?\])+", rule):
                raise ProfileError(f"{name}: a rule this module does not understand: {rule!r}")
    _check_refusals(policy, rules)
    _check_conditional(rules)
    _check_differences(policy, rules)


def _check_refusals(policy: str, rules: dict[str, list[str]]) -> None:
    default = default_errno(policy)
    required: dict[str, int] = {}
    for family, calls in MUST_REFUSE.items():
        for name, errno in calls.items():
            if required.setdefault(name, errno) != errno:
                raise ProfileError(f"MUST_REFUSE: {name} is required with two errnos")
            got = answer(policy, rules, name)
            if errno == default and name in rules:
                raise ProfileError(f"{family}: {name} must be left to the default {_errname(default)}")
            if got != _errname(errno):
                raise ProfileError(f"{family}: {name} is {got}, must be {_errname(errno)}")
    named_refusals = {n for n in rules if answer(policy, rules, n) not in ("allowed", "conditional")}
    extra = sorted(named_refusals - set(required))
    if extra:
        raise ProfileError(f"refused but not in MUST_REFUSE (add them with a family): {extra}")


def _check_conditional(rules: dict[str, list[str]]) -> None:
    with_args = {n for n, r in rules.items() if any("[" in x for x in r)}
    if with_args != set(CONDITIONAL):
        raise ProfileError(f"calls with argument rules are {sorted(with_args)}, not {sorted(CONDITIONAL)}")
    for name, want in CONDITIONAL.items():
        if rules[name] != list(want):
            raise ProfileError(f"{name}: the rules are {rules[name]}, not {list(want)}")


def _check_differences(policy: str, rules: dict[str, list[str]]) -> None:
    """Each documented difference says what the file really answers."""
    for name in STRICTER:
        if (got := answer(policy, rules, name)) != "EPERM":
            raise ProfileError(f"documented as refused (EPERM) where moby allows it, but {name} is {got}")
    for name in (*UNRESOLVED_BY_LIBSECCOMP_2_5_4, *OTHER_ARCH_NAMES):
        if (got := answer(policy, rules, name)) != "allowed":
            raise ProfileError(f"documented as in the allow list, but {name} is {got}")
    if _errname(default_errno(policy)) != DEFAULT_DIFFERENCE.ours:
        raise ProfileError(f"the default is {policy!r}, documented as {DEFAULT_DIFFERENCE.ours}")
    for diff in ARGUMENT_DIFFERENCES:
        name = diff.calls.split()[0]
        if any(not r.startswith("allow") for r in rules.get(name, [])):
            raise ProfileError(f"{name} has an errno rule: its other arguments are not the default")
        if _errname(default_errno(policy)) != diff.ours:
            raise ProfileError(f"{diff.calls} is documented as {diff.ours}, the default is {policy!r}")


# -- the audit against moby (a file the developer fetched, given on the command line) ----------------
# moby's arch names for LXC's [all] on an x86_64 host (the native arch and its compat arches)
ARCHES = ("amd64", "x86", "x32")
DOCKER_DEFAULT_CAPS = frozenset(
    {
        "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
        "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
        "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
    }
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class MobyRule:
    names: tuple[str, ...]
    action: str  # allow | errno
    errno: int | None
    args: tuple[str, ...]  # each argument condition in LXC's syntax


def _lxc_arg(arg: dict[str, Any]) -> str:
    """One of moby's argument conditions in LXC's syntax (masked compares: [index,datum,op,mask])."""
    if arg["op"] == "SCMP_CMP_MASKED_EQ":
        return f"[{arg['index']},{arg.get('valueTwo', 0)},SCMP_CMP_MASKED_EQ,{arg['value']}]"
    return f"[{arg['index']},{arg['value']},{arg['op']}]"


def moby_rules(
    moby: dict[str, Any], caps: frozenset[str] = DOCKER_DEFAULT_CAPS, arches: tuple[str, ...] = ARCHES
) -> list[MobyRule]:
    """The rules moby applies to a container with ``caps`` on ``arches`` (kernel >= 4.8), as
    moby's seccomp.go filters them: every included cap present, no excluded cap present, an
    included arch among ours, not all of ours excluded."""
    out = []
    for rule in moby["syscalls"]:
        inc, exc = rule.get("includes") or {}, rule.get("excludes") or {}
        if not set(inc.get("caps") or ()) <= caps or set(exc.get("caps") or ()) & caps:
            continue
        if inc.get("arches") and not set(inc["arches"]) & set(arches):
            continue
        if exc.get("arches") and set(arches) <= set(exc["arches"]):
            continue
        args = tuple(_lxc_arg(a) for a in rule.get("args") or ())
        action = "allow" if rule["action"] == "SCMP_ACT_ALLOW" else "errno"
        errno = None if action == "allow" else int(rule.get("errnoRet", moby["defaultErrnoRet"]))
        out.append(MobyRule(tuple(rule["names"]), action, errno, args))
    return out


def _moby_names(moby: dict[str, Any], arches: tuple[str, ...] = ARCHES) -> set[str]:
    """Every name moby's profile mentions, but in rules restricted to other arches."""
    names: set[str] = set()
    for rule in moby["syscalls"]:
        inc = (rule.get("includes") or {}).get("arches")
        if not inc or set(inc) & set(arches):
            names |= set(rule["names"])
    return names


def _moby_default(moby: dict[str, Any]) -> str:
    if moby["defaultAction"] == "SCMP_ACT_ERRNO":
        return _errname(int(moby.get("defaultErrnoRet", EPERM)))
    return str(moby["defaultAction"])


def compare(moby: dict[str, Any], text: str) -> list[tuple[str, str, str]]:
    """Where the profile ``text`` answers differently from moby's: [(calls, moby, ours)]."""
    policy, rules = parse_lxc_profile(text)
    ours_default, moby_default = _errname(default_errno(policy)), _moby_default(moby)
    allowed: set[str] = set()
    allow_args: dict[str, set[str]] = {}
    errnos: dict[str, int] = {}
    for r in moby_rules(moby):
        for n in r.names:
            if r.action == "allow" and not r.args:
                allowed.add(n)
            elif r.action == "allow":
                allow_args.setdefault(n, set()).add(" ".join(r.args))
            elif r.errno is not None and not r.args:
                errnos[n] = r.errno

    def moby_answer(name: str) -> str:
        if name in allowed:
            return "allowed"
        if name in allow_args:
            return "conditional"
        return _errname(errnos[name]) if name in errnos else moby_default

    out: list[tuple[str, str, str]] = []
    for name in sorted(_moby_names(moby) | set(rules)):
        theirs, ours = moby_answer(name), answer(policy, rules, name)
        if theirs == ours == "conditional":
            ours_args = {r.removeprefix("allow ") for r in rules[name] if r.startswith("allow ")}
            if ours_args != allow_args[name]:
                moby_list, ours_list = sorted(allow_args[name]), sorted(ours_args)
                out.append((name, f"allowed with {moby_list}", f"allowed with {ours_list}"))
            elif not any(r.startswith("errno") for r in rules[name]) and moby_default != ours_default:
                out.append((f"{name} with other arguments", moby_default, ours_default))
        elif theirs != ours:
            out.append((name, theirs, ours))
    if moby_default != ours_default:
        out.append((DEFAULT_DIFFERENCE.calls, moby_default, ours_default))
    return out


def _compare_main(path: Path) -> int:
    found = compare(json.loads(path.read_text()), PROFILE_FILE.read_text())
    print(f"{PROFILE_FILE.relative_to(REPO)} against {path}:")
    print("calls | moby (default caps, amd64/x86/x32) | ours")
    for row in found:
        print(" | ".join(row))
    documented = documented_moby_differences()
    new, gone = set(found) - documented, documented - set(found)
    for row in sorted(new):
        print(f"NOT DOCUMENTED: {' | '.join(row)}")
    for row in sorted(gone):
        print(f"DOCUMENTED BUT NOT FOUND: {' | '.join(row)}")
    print("the differences are the documented ones" if not new | gone else "review the differences above")
    return 0 if not new | gone else 1


# -- the docs section -------------------------------------------------------------------------------
FAMILY_DOC = (
    # (family of kernel_probe.py, control, calls refused (errno), what else holds)
    ("userns", "SBX-ESC-08",
     "unshare and clone with CLONE_NEWUSER (EPERM), clone3 (ENOSYS: libc falls back to clone)",
     "plain fork/threads pass (clone without namespace flags)"),
    ("setns", "SBX-ESC-15", "setns, unshare (any flags), clone with any namespace flag (EPERM)", ""),
    ("keyring", "SBX-ESC-16", "keyctl, add_key, request_key (EPERM)", ""),
    ("io_uring", "SBX-ESC-17", "io_uring_setup, io_uring_enter, io_uring_register (EPERM)", ""),
    ("userfaultfd", "SBX-ESC-18", "userfaultfd (EPERM)", ""),
    ("bpf", "SBX-ESC-19", "bpf (EPERM)", ""),
    ("perf_event_open", "SBX-ESC-20", "perf_event_open (EPERM)", ""),
    ("mount", "SBX-ESC-21",
     "mount, umount2, pivot_root and the new mount API: open_tree, move_mount, fsopen, fsconfig, fsmount, "
     "fspick, mount_setattr (EPERM)", ""),
    ("clock", "SBX-ESC-22", "settimeofday, clock_settime (EPERM)", "reading clocks and adjtimex(0) pass"),
    ("ptrace", "SBX-ESC-23",
     "ptrace, process_vm_readv, process_vm_writev, kcmp, pidfd_getfd, process_madvise (EPERM)", ""),
    ("module", "SBX-ESC-07", "init_module, finit_module, delete_module (EPERM)", ""),
    ("reboot", "SBX-ESC-24", "reboot, kexec_load, kexec_file_load (EPERM)", ""),
    ("admin", "SBX-ESC-25",
     "swapon/off, acct, quotactl, syslog, sethostname, setdomainname, open_by_handle_at, iopl, ioperm, "
     "lookup_dcookie, fanotify_init, NUMA policy calls, socket(AF_ALG / AF_VSOCK) (EPERM)", ""),
)  # fmt: skip


def render_markdown() -> str:
    """The profile section of docs/controls.md (after checking the file says what it documents)."""
    check_profile()
    lines = [
        "## Seccomp profile",
        "",
        f"`{PROFILE_FILE.relative_to(REPO)}` (installed by `template_build` as",
        "`template_build_seccomp_profile`, referenced by `lxc.seccomp.profile` in the template's config, so",
        "every clone, local or made by the PVE test server, loads it; on Proxmox VE the node play installs",
        "it on every node and names it in the template CT's raw `lxc.seccomp.profile`, which every linked",
        "clone copies). The file is the source of truth;",
        "`tests/hardening/seccomp_profile.py` holds the requirements it is checked against",
        "(tests/unit/test_seccomp_profile.py): the calls it must refuse with their errno (`MUST_REFUSE`),",
        "the argument rules (`CONDITIONAL`) and the differences from moby below, each checked against the",
        "file. It was audited against " + MOBY_AUDITED + ", evaluated as moby does for a",
        "container with Docker's default capabilities (no CAP_SYS_ADMIN) on amd64 with its x86 and x32",
        "compat arches. moby's file is not in this repository; to audit again, fetch it yourself",
        "(`git clone https://github.com/moby/profiles`, check out cd3bed8061c7 or a newer commit) and run",
        f"`{COMPARE}`: it prints the differences and fails unless they are exactly the documented ones",
        "(all rows below but the libseccomp one, which the unit test checks on the host).",
        "",
        "LXC 5.0.2 loads it as a v2 allowlist whose default is ENOSYS; what moby refuses is named with"
        " EPERM. PID 1 and every process of a sandbox run under it (`Seccomp: 2`); the controls below read"
        " the filter the kernel really holds for the sandbox (`PTRACE_SECCOMP_GET_FILTER`) and make each"
        " call as the sandbox user, so a refusal by the filter is told from one by the kernel's own checks.",
        "",
        "| calls | moby (default caps) | ours | why |",
        "|---|---|---|---|",
    ]
    for d in documented_differences():
        lines.append(f"| {d.calls} | {d.moby} | {d.ours} | {d.why} |")
    unprobed = [f"{f} ({', '.join(sorted(MUST_REFUSE[f]))})" for f in UNPROBED_FAMILIES]
    lines += [
        "",
        "Nothing that moby refuses is allowed here. Refused call families and their controls (a summary of",
        "`MUST_REFUSE`; also refused, without a probe of their own: " + "; ".join(unprobed) + "):",
        "",
        "| family | control | refused (errno) | still works |",
        "|---|---|---|---|",
    ]
    for family, control, calls, works in FAMILY_DOC:
        lines.append(f"| {family} | {control} | {calls} | {works} |")
    lines += [
        "",
        "Second lock against nested user namespaces (SBX-ESC-14): the template's `lxc.hook.start-host`"
        " (`roles/template_build/files/sandbox-rt-userns-lock`) sets `user.max_user_namespaces = 0` in the"
        " sandbox's own user namespace before its init runs (LXC's `lxc.sysctl` cannot: the sandbox's"
        " `/proc/sys` is read-only, `proc:mixed`), so creating a user namespace fails with ENOSPC even"
        " without the filter; neither the user nor container root can raise it back (read-only"
        " `/proc/sys`, no CAP_SYS_ADMIN, mount refused).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.hardening.seccomp_profile",
        description="Check the sandboxes' seccomp profile against our requirements, or audit it "
        "against a moby default.json you fetched yourself.",
    )
    parser.add_argument("--compare", type=Path, metavar="PATH", help="moby/profiles' seccomp/default.json")
    args = parser.parse_args(argv)
    if args.compare is not None:
        if not args.compare.is_file():
            parser.error(f"--compare {args.compare}: no such file (fetch moby's default.json first)")
        return _compare_main(args.compare)
    try:
        check_profile()
    except ProfileError as e:
        print(f"{PROFILE_FILE.relative_to(REPO)}: {e}", file=sys.stderr)
        return 1
    print(f"{PROFILE_FILE.relative_to(REPO)} meets the requirements")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
