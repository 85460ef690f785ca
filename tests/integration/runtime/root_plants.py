"""Code planted to run as root (issue 35 items 1 and 2): every way a template step or a root sandbox
can leave something behind that root processes of a later sandbox would execute or load.

``plant_script(vectors)`` is a shell script, run as root in a build sandbox or a ``root=True``
sandbox, that compiles a marker program with the sandbox's gcc and plants it on the chosen vectors.
Each planted piece appends ``<hostname> <vector> <ruid> <euid>`` to ``LOG`` whenever it runs, so a
later sandbox tells who ran what (its hostname is its id: lines from the sandbox that planted, or from
a template's build, are told apart). ``uids_in(host_pid_ns)`` reads, from the host, the ids of every
process of a running sandbox: what the sandbox reports is not trusted for the verdict.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

__all__ = [
    "ALL_VECTORS",
    "BUILD_VECTORS",
    "LOG",
    "exercise",
    "logged",
    "plant_script",
    "process_ids",
]

PLANT = "/opt/sbx-plant"
LOG = f"{PLANT}/log"

# every vector; the template build's checks refuse the last four before a template exists (setuid
# and file-capability files, /sbin/sandbox-init and sshd_config are controls), so a template step
# plants only BUILD_VECTORS and a root sandbox's snapshot carries them all
BUILD_VECTORS = (
    "pam-session",  # sshd's session stack (common-session): pam_exec runs the marker
    "pam-account",  # common-account: runs for public-key logins too
    "pam-auth",  # common-auth
    "nss",  # an NSS module named in nsswitch.conf (loaded by every passwd lookup)
    "ld-preload",  # /etc/ld.so.preload: a library every dynamically linked program loads
    "ld-conf",  # ld.so.conf.d: an NSS module found only through a directory added there
    "sshd",  # /usr/sbin/sshd replaced by a wrapper
    "sh",  # /bin/sh replaced by a compiled wrapper around dash
    "cron",  # /etc/cron.d and a systemd unit: nothing in a sandbox starts them
)
ALL_VECTORS = (*BUILD_VECTORS, "init", "sshd-config", "setuid", "file-cap")

_MARK_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
static void mark(const char *tag) {
  char host[128] = "?", line[256];
  gethostname(host, sizeof host - 1);
  int n = snprintf(line, sizeof line, "%s %s %d %d\n", host, tag, (int)getuid(), (int)geteuid());
  int fd = open("LOGPATH", O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
  if (fd >= 0) { if (write(fd, line, n) < 0) {} close(fd); }
}
#ifdef LIBRARY
__attribute__((constructor)) static void at_load(void) { mark(TAG); }
#else
int main(int argc, char **argv) {
#ifdef BECOME_ROOT
  if (setuid(0) != 0) {}
#endif
#ifdef EXEC_DASH
  mark(TAG);
  argv[0] = "/bin/dash";
  execv("/bin/dash", argv);
#else
  mark(argc > 1 ? argv[1] : TAG);
#endif
  return 0;
}
#endif
""".replace("LOGPATH", LOG)


def _wrapped(program: str, vector: str) -> list[str]:
    """Steps that put a wrapper in ``program``'s place: it marks, then runs the real one."""
    wrapper = f'#!/bin/dash\n{PLANT}/mark {vector}\nexec {program}.real "$@"\n'
    return [
        f"mv {program} {program}.real",
        f"printf %s {shlex.quote(wrapper)} > {program} && chmod 0755 {program}",
    ]


def plant_script(vectors: tuple[str, ...]) -> str:
    """The root shell script that plants ``vectors`` (it stops at the first failure)."""
    cc = f"gcc -O1 -o {PLANT}"
    steps = [
        "set -eu",
        f"mkdir -p {PLANT}/lib && chmod 0755 {PLANT} {PLANT}/lib",
        f"cat > {PLANT}/mark.c <<'EOF'\n{_MARK_C}\nEOF",
        f": > {LOG} && chmod 0666 {LOG}",
        f"{cc}/mark -DTAG='\"mark\"' {PLANT}/mark.c",
    ]
    lib = f"gcc -O1 -shared -fPIC -DLIBRARY {PLANT}/mark.c"
    for pam in ("session", "account", "auth"):
        if f"pam-{pam}" in vectors:
            line = f"{pam} optional pam_exec.so {PLANT}/mark pam-{pam}"
            steps.append(f"echo '{line}' >> /etc/pam.d/common-{pam}")
    if "nss" in vectors or "ld-conf" in vectors:
        services = []
        if "nss" in vectors:
            steps.append(f"{lib} -DTAG='\"nss\"' -o /usr/lib/x86_64-linux-gnu/libnss_sbxplant.so.2")
            services.append("sbxplant")
        if "ld-conf" in vectors:
            steps.append(f"{lib} -DTAG='\"ld-conf\"' -o {PLANT}/lib/libnss_sbxplantdir.so.2")
            steps.append(f"echo {PLANT}/lib > /etc/ld.so.conf.d/00-sbx-plant.conf && ldconfig")
            services.append("sbxplantdir")
        extra = " ".join(services)
        steps.append(f"sed -i -E 's/^(passwd|group|shadow):.*/& {extra}/' /etc/nsswitch.conf")
    if "ld-preload" in vectors:
        steps.append(f"{lib} -DTAG='\"ld-preload\"' -o {PLANT}/libpreload.so")
        steps.append(f"echo {PLANT}/libpreload.so >> /etc/ld.so.preload")
    if "sshd" in vectors:
        steps += _wrapped("/usr/sbin/sshd", "sshd")
    if "sh" in vectors:
        steps.append(f"{cc}/sh -DTAG='\"sh\"' -DEXEC_DASH {PLANT}/mark.c")
        steps.append(f"cp {PLANT}/sh /bin/sh.sbx-plant && mv -f /bin/sh.sbx-plant /bin/sh")
    if "cron" in vectors:
        steps.append(f"echo '* * * * * root {PLANT}/mark cron' > /etc/cron.d/sbx-plant")
        unit = f"[Service]\nExecStart={PLANT}/mark unit\n[Install]\nWantedBy=multi-user.target\n"
        steps.append(f"printf %s {shlex.quote(unit)} > /etc/systemd/system/sbx-plant.service")
    if "init" in vectors:
        steps += _wrapped("/sbin/sandbox-init", "init")
    if "sshd-config" in vectors:
        # runs as root before the key check of every login (and as the user it names otherwise)
        steps.append(f"sed -i '1i AuthorizedKeysCommand {PLANT}/mark sshd-config' /etc/ssh/sshd_config")
        steps.append("sed -i '1i AuthorizedKeysCommandUser root' /etc/ssh/sshd_config")
    if "setuid" in vectors:
        steps.append(f"{cc}/setuid -DTAG='\"setuid\"' {PLANT}/mark.c && chmod 4755 {PLANT}/setuid")
    if "file-cap" in vectors:
        steps.append(f"{cc}/file-cap -DTAG='\"file-cap\"' -DBECOME_ROOT {PLANT}/mark.c")
        # cap_setuid in the permitted and effective sets (VFS_CAP_REVISION_2)
        xattr = (
            "import os, struct; os.setxattr('{path}', 'security.capability', "
            "struct.pack('<IIIII', 0x02000001, 1 << 7, 0, 0, 0))"
        ).format(path=f"{PLANT}/file-cap")
        steps.append(f"python3 -c {shlex.quote(xattr)}")
    return "\n".join(steps) + "\n"


def exercise(vectors: tuple[str, ...]) -> str:
    """What the sandbox user runs to set off what only it can: lookups through NSS, the setuid and
    file-capability programs."""
    lines = ["getent passwd nobody-here >/dev/null; getent group nobody-here >/dev/null"]
    for program in ("setuid", "file-cap"):
        if program in vectors:
            lines.append(f"{PLANT}/{program}")
    return "; ".join(lines) + "; true"


def logged(log_text: str, hostname: str) -> list[tuple[str, int, int]]:
    """(vector, ruid, euid) of the lines ``hostname`` wrote (malformed lines are skipped)."""
    out = []
    for line in log_text.splitlines():
        words = line.split()
        if len(words) == 4 and words[0] == hostname and words[2].isdigit() and words[3].isdigit():
            out.append((words[1], int(words[2]), int(words[3])))
    return out


def process_ids(init_pid: int) -> dict[int, tuple[int, ...]]:
    """{host pid: (real, effective, saved, fs uid as the host numbers them)} of every process in
    the pid namespace of ``init_pid``, read from the host's /proc."""
    ns = os.readlink(f"/proc/{init_pid}/ns/pid")
    out: dict[int, tuple[int, ...]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "ns" / "pid") != ns:
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("Uid:"):
                    out[int(entry.name)] = tuple(int(v) for v in line.split()[1:])
        except (OSError, ValueError):
            continue  # gone meanwhile
    return out
