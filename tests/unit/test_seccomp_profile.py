"""The sandboxes' seccomp profile (roles/template_build/files/sandbox.seccomp) meets our written
requirements (tests/hardening/seccomp_profile.py): it refuses every call of MUST_REFUSE with its
errno and allows none of them, its argument rules are the required ones, it names every call this
host's libseccomp knows, and its documented differences from moby are its real answers. Plus the
host-side helpers the hardening controls use: the classic-BPF evaluator and the template-variant
config editor."""

from __future__ import annotations

import ctypes
import ctypes.util
import re
import struct

import pytest

from tests.hardening import kernel_probe, seccomp_filter, seccomp_profile, variants
from tests.hardening.checks import FAMILY_CONTROLS, FILTER_ERRNO

AUDIT_ARCHES = {"x86_64": 0xC000003E, "x86": 0x40000003, "x32": 0x4000003E}


def _profile() -> tuple[str, dict[str, list[str]]]:
    return seccomp_profile.parse_lxc_profile(seccomp_profile.PROFILE_FILE.read_text())


def _libseccomp() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp")
    if name is None:
        pytest.skip("libseccomp is not installed (LXC is not either: nothing loads the profile here)")
    lib = ctypes.CDLL(name)
    lib.seccomp_syscall_resolve_num_arch.argtypes = [ctypes.c_uint32, ctypes.c_int]
    lib.seccomp_syscall_resolve_num_arch.restype = ctypes.c_void_p
    lib.seccomp_syscall_resolve_name_arch.argtypes = [ctypes.c_uint32, ctypes.c_char_p]
    return lib


def test_the_profile_meets_every_requirement() -> None:
    seccomp_profile.check_profile()


def test_the_profile_is_an_allowlist_answering_enosys_and_refuses_what_it_must() -> None:
    policy, rules = _profile()
    assert policy == "allowlist errno 38"
    assert "clone3" not in rules  # the default (ENOSYS): libseccomp refuses a rule equal to it
    refused = {n for n, r in rules.items() if r == ["errno 1"]}
    for family, calls in seccomp_profile.MUST_REFUSE.items():
        for name, errno in calls.items():
            if errno == 38:
                assert name not in rules, f"{family}: {name}"
            else:
                assert rules[name] == [f"errno {errno}"], f"{family}: {name}"
    must = "keyctl add_key request_key io_uring_setup userfaultfd bpf unshare setns mount fsopen open_tree"
    for name in (*must.split(), "ptrace", "kexec_load", "init_module", "reboot"):
        assert name in refused, name
    required = {n for calls in seccomp_profile.MUST_REFUSE.values() for n, e in calls.items() if e == 1}
    assert refused == required  # every refusal is a written requirement, and the other way round
    allowed = {n for n, r in rules.items() if any(x == "" or x.startswith("allow") for x in r)}
    assert not allowed & required


def _with_allowed(text: str, name: str) -> str:
    """The profile text with ``name`` moved from the refusals to the allow list."""
    assert f"\n{name} errno 1\n" in text
    text = text.replace(f"\n{name} errno 1\n", "\n")
    return text.replace("\n# -- allowed with conditions", f"\n{name}\n# -- allowed with conditions", 1)


@pytest.mark.parametrize("name", ["keyctl", "unshare", "ptrace", "vhangup", "lsm_set_self_attr"])
def test_the_check_fails_when_a_refused_call_is_allowed(name: str) -> None:
    text = seccomp_profile.PROFILE_FILE.read_text()
    seccomp_profile.check_profile(text)
    with pytest.raises(seccomp_profile.ProfileError, match=name):
        seccomp_profile.check_profile(_with_allowed(text, name))
    # also when the allow line is added beside the refusal
    added = text.replace("\n# -- allowed with conditions", f"\n{name}\n# -- allowed with conditions", 1)
    with pytest.raises(seccomp_profile.ProfileError, match=name):
        seccomp_profile.check_profile(added)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("allowlist errno 38", "allowlist errno 1"),  # EPERM by default: clone3 would not fall back
        ("\n# -- refused: EPERM\n", "\n# -- refused: EPERM\nclone3 errno 38\n"),  # clone3 named
        ("[0,0,SCMP_CMP_MASKED_EQ,2114060288]", "[0,2114060288,SCMP_CMP_MASKED_EQ,0]"),  # mask 0
        ("socket errno 1 [0,40,SCMP_CMP_EQ]\n", "socket allow [0,40,SCMP_CMP_EQ]\n"),  # AF_VSOCK
        ("personality allow [0,8,SCMP_CMP_EQ]\n", "personality\n"),  # any persona
        ("\ngetrandom\n", "\ngetrandom\nnewcall errno 1\n"),  # a refusal nobody wrote down
        ("\nmseal\n", "\n"),  # a documented libseccomp row that is no longer in the file
        ("\nkeyctl errno 1\n", "\n"),  # a required refusal left to the default (ENOSYS)
    ],
)
def test_the_check_fails_on_each_broken_requirement(old: str, new: str) -> None:
    text = seccomp_profile.PROFILE_FILE.read_text()
    assert old in text
    with pytest.raises(seccomp_profile.ProfileError):
        seccomp_profile.check_profile(text.replace(old, new, 1))


def test_the_documented_differences_are_the_files_answers() -> None:
    policy, rules = _profile()
    rows = {d.calls: d for d in seccomp_profile.documented_differences()}
    for name, why in seccomp_profile.STRICTER.items():
        assert (rows[name].moby, rows[name].ours, rows[name].why) == ("allowed", "EPERM", why)
        assert seccomp_profile.answer(policy, rules, name) == "EPERM"
        assert name in seccomp_profile.MUST_REFUSE["ptrace"]
    assert seccomp_profile.answer(policy, rules, "a_call_nobody_names") == "ENOSYS"
    assert rules["personality"] and all(r.startswith("allow [") for r in rules["personality"])
    # the rows --compare must reproduce: every documented row but the libseccomp one
    assert len(seccomp_profile.documented_moby_differences()) == len(rows) - 1


def test_compare_reports_what_a_moby_style_profile_answers_differently() -> None:
    """The audit tool on a small profile in moby's format (written here, not moby's file)."""
    moby = {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": 1,
        "syscalls": [
            {"names": ["read", "ptrace", "gone"], "action": "SCMP_ACT_ALLOW"},
            {"names": ["clone"], "action": "SCMP_ACT_ALLOW",
             "args": [{"index": 0, "value": 2114060288, "op": "SCMP_CMP_MASKED_EQ"}],
             "excludes": {"caps": ["CAP_SYS_ADMIN"], "arches": ["s390", "s390x"]}},
            {"names": ["clone"], "action": "SCMP_ACT_ALLOW",
             "args": [{"index": 1, "value": 2114060288, "op": "SCMP_CMP_MASKED_EQ"}],
             "includes": {"arches": ["s390", "s390x"]}},
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38,
             "excludes": {"caps": ["CAP_SYS_ADMIN"]}},
            {"names": ["mount", "bpf"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}},
            {"names": ["personality"], "action": "SCMP_ACT_ALLOW",
             "args": [{"index": 0, "value": 8, "op": "SCMP_CMP_EQ"}]},
        ],
    }  # fmt: skip
    ours = "\n".join(
        [
            "2", "allowlist errno 38", "[all]", "read", "write", "ptrace errno 1", "mount errno 1",
            "clone allow [0,0,SCMP_CMP_MASKED_EQ,2114060288]", "personality allow [0,0,SCMP_CMP_EQ]",
        ]
    )  # fmt: skip
    assert seccomp_profile.compare(moby, ours) == [
        ("bpf", "EPERM", "ENOSYS"),  # moby refuses it by its default, we do not name it
        ("clone with other arguments", "EPERM", "ENOSYS"),
        ("gone", "allowed", "ENOSYS"),  # moby allows, we do not name
        ("personality", "allowed with ['[0,8,SCMP_CMP_EQ]']", "allowed with ['[0,0,SCMP_CMP_EQ]']"),
        ("ptrace", "allowed", "EPERM"),
        ("write", "EPERM", "allowed"),  # we allow what moby refuses
        ("calls neither profile names", "EPERM", "ENOSYS"),
    ]


def test_clone_is_allowed_only_without_namespace_flags_in_lxc_argument_order() -> None:
    _, rules = _profile()
    mask = sum(seccomp_profile.NAMESPACE_FLAGS.values())
    assert mask == 2114060288  # moby's value
    clone = rules["clone"]
    # LXC: [index,value,SCMP_CMP_MASKED_EQ,mask] is (arg & mask) == value; the other order masks 0
    assert f"allow [0,0,SCMP_CMP_MASKED_EQ,{mask}]" in clone
    perms = [re.fullmatch(r"errno 1 \[0,(\d+),SCMP_CMP_MASKED_EQ,(\d+)\]", r) for r in clone]
    flags = {int(m.group(1)) for m in perms if m and m.group(1) == m.group(2)}
    assert flags == set(seccomp_profile.NAMESPACE_FLAGS.values())
    assert clone == list(seccomp_profile.CONDITIONAL["clone"])


def test_every_call_libseccomp_knows_on_x86_64_is_named() -> None:
    """Nothing the kernel has falls to the default by accident (only clone3, on purpose)."""
    lib = _libseccomp()
    _, rules = _profile()
    known = set()
    for nr in range(1024):
        name = lib.seccomp_syscall_resolve_num_arch(AUDIT_ARCHES["x86_64"], nr)
        if name:
            known.add(ctypes.string_at(name).decode())
    assert len(known) > 300
    assert sorted(known - set(rules)) == ["clone3"]


def test_the_unresolvable_names_are_the_documented_ones() -> None:
    lib = _libseccomp()
    _, rules = _profile()
    unresolved = {
        n
        for n, r in rules.items()
        if r == [""]
        and all(lib.seccomp_syscall_resolve_name_arch(a, n.encode()) < 0 for a in AUDIT_ARCHES.values())
    }
    lib.seccomp_version.restype = ctypes.POINTER(ctypes.c_uint * 3)
    major, minor, micro = lib.seccomp_version().contents
    if (major, minor, micro) != (2, 5, 4):
        pytest.skip(
            f"the documented list is libseccomp 2.5.4's (Debian 12, LXC 5.0.2), "
            f"this is {major}.{minor}.{micro}"
        )
    documented = seccomp_profile.UNRESOLVED_BY_LIBSECCOMP_2_5_4 + seccomp_profile.OTHER_ARCH_NAMES
    assert unresolved == set(documented)


def test_every_probed_call_is_refused_by_name_and_every_family_has_a_control() -> None:
    _, rules = _profile()
    assert set(kernel_probe.FAMILIES) == set(FAMILY_CONTROLS)
    assert {f for f, *_ in seccomp_profile.FAMILY_DOC} == set(FAMILY_CONTROLS)
    assert set(seccomp_profile.MUST_REFUSE) == set(FAMILY_CONTROLS) | set(seccomp_profile.UNPROBED_FAMILIES)
    for family, calls in kernel_probe.FAMILIES.items():
        for call in calls:
            name = call.split("(")[0]
            if name not in ("clone", "socket"):  # argument rules: CONDITIONAL
                assert seccomp_profile.MUST_REFUSE[family][name] == FILTER_ERRNO.get(call, 1), call
            if call in FILTER_ERRNO:  # clone3: the default, ENOSYS
                assert name not in rules, call
            elif name in ("clone", "socket"):
                assert any(r.startswith("errno 1 [") for r in rules[name]), call
            else:
                assert rules.get(name) == ["errno 1"], f"{family}: {call}"


# -- the host-side helpers ------------------------------------------------------------------------
def _insn(code: int, jt: int, jf: int, k: int) -> tuple[int, int, int, int]:
    return seccomp_filter._decode(int.from_bytes(struct.pack("<HBBI", code, jt, jf, k), "little"))


def test_bpf_evaluator_runs_a_seccomp_program_and_picks_the_strongest_action() -> None:
    ld_abs, jeq, ret = 0x20, 0x15, 0x06
    program = [
        _insn(ld_abs, 0, 0, 4),  # arch
        _insn(jeq, 1, 0, seccomp_filter.AUDIT_ARCH_X86_64),
        _insn(ret, 0, 0, 0x80000000),  # kill
        _insn(ld_abs, 0, 0, 0),  # nr
        _insn(jeq, 0, 1, 250),  # keyctl
        _insn(ret, 0, 0, 0x00050001),  # errno EPERM
        _insn(ld_abs, 0, 0, 16),  # args[0] low word
        _insn(0x45, 0, 1, 0x10000000),  # jset CLONE_NEWUSER
        _insn(ret, 0, 0, 0x00050026),  # errno ENOSYS
        _insn(ret, 0, 0, 0x7FFF0000),  # allow
    ]
    v = seccomp_filter.verdict
    assert v([program], 250, []) == seccomp_filter.Verdict("errno", 1)
    assert v([program], 56, [0x10000011]) == seccomp_filter.Verdict("errno", 38)
    assert v([program], 0, [0]) == seccomp_filter.Verdict("allow", 0)
    log_all = [_insn(ret, 0, 0, 0x7FFC0000)]
    assert v([log_all, program], 250, []).action == "errno"  # errno outranks log
    assert v([log_all, program], 0, []).action == "log"  # log outranks allow


def test_variant_config_edits_replace_remove_and_append() -> None:
    lines = ["# c", "lxc.a = 1", "lxc.b = 2", "lxc.b = 3", "lxc.c = 4"]
    out = variants.edit_config(lines, {"lxc.a": "9", "lxc.b": None, "lxc.d": "5"})
    assert out == ["# c", "lxc.a = 9", "lxc.c = 4", "lxc.d = 5"]
