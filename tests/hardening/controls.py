"""The hardening control catalogue: every control, the seed checklist item it covers, where it is
enforced, and its waiver if any. ``python -m tests.hardening.controls > docs/controls.md`` writes
the table; tests/unit/test_hardening_catalogue.py checks that the file is current, that every
control has exactly one test (``test_SBX_<FAMILY>_<NN>_...`` in tests/hardening) and vice versa,
that every seed checklist item is covered and that the ids in role task names are all here.

Ids follow the role task names (ansible-lockdown style; ``--tags SBX-SSH`` etc.): USER, SSH, LIM,
SVC, ID, INIT come from roles/sandbox_template; NET, RES, ESC, ACC, LIFE are defined here.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.hardening import seccomp_profile

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
WAIVERS_FILE = HERE / "waivers.yml"
ID_PATTERN = re.compile(r"^SBX-(USER|SSH|LIM|SVC|ID|INIT|NET|RES|ESC|ACC|LIFE)-\d\d$")

# The seed guide's checklist (../shared/seeds/go-llm-sandbox-setup.md), section 7 verbatim, plus the
# section 3.4 isolation test. Keys are ours; the unit test compares the texts with the seed when the
# seed is at hand.
SEED_CHECKLIST: dict[str, str] = {
    "7.ct.unprivileged": "Containers are unprivileged (verify UID mapping in `/etc/pve/lxc/<id>.conf`)",
    "7.ct.nesting": "Nesting is disabled (`features: nesting=0`)",
    "7.ct.swap": "Swap is disabled on containers (`swap: 0`)",
    "7.ct.pool": "Resource pool scoping: API token can only touch `sandbox-pool`",
    "7.net.bridge": "`vmbr1` has no physical ports (`bridge-ports none`)",
    "7.net.loaded": "nftables rules loaded: `nft list ruleset` shows sandbox table",
    "7.net.persist": "nftables persists across reboots: `systemctl is-enabled nftables`",
    "7.net.deny": "Default-deny outbound for containers",
    "7.net.dns": "DNS (port 53) allowed for all containers",
    "7.net.http": "HTTP/HTTPS only for containers in `internet_allowed` set",
    "7.net.rate": "Rate limiting active (50 conn/sec)",
    "7.net.mgmt": "Containers cannot reach Proxmox management (port 8006 blocked)",
    "7.sec.apparmor": "AppArmor profile active: `lxc-container-default-cgns`",
    "7.sec.nproc": "Process limits in `/etc/security/limits.conf` (nproc 256/512)",
    "7.sec.core": "Core dumps disabled",
    "7.sec.caps": "Capability drops verified in container config",
    "7.fn.forkbomb": (
        "**Fork bomb test**: run `:(){ :|:& };:` in container → PID limit fires, container survives"
    ),
    "7.fn.oom": "**OOM test**: allocate >1GB memory → container OOM-killed, host unaffected",
    "7.fn.nmap": "**Network scan test**: `nmap` from container → blocked by nftables",
    "7.fn.escape": "**Container escape test**: attempt to mount host filesystem → denied",
    "7.fn.lan": "**LAN access test**: ping LAN hosts → blocked",
    "7.fn.cross": "**Cross-container test**: ping other sandbox containers → blocked",
    "7.fn.noinet": "**Internet access test**: HTTP without being in `internet_allowed` → blocked",
    "7.fn.inet": "**Internet access test**: add to `internet_allowed` → HTTP works",
    "7.fn.cleanup": "**Cleanup test**: destroy container → verify no orphan volumes",
    "7.op.ssh": "Clone template → container starts → SSH connects → commands work",
    "7.op.sftp": "File upload/download via SFTP works",
    "7.op.destroy": "Container destroy removes all resources",
    "7.op.orphan": "Orphan cleanup: kill application mid-session, restart, verify cleanup",
    "3.4.dns": "Should work: DNS resolution (`dig google.com`)",
    "3.4.http": "Should be blocked: HTTP (not in internet_allowed set)",
    "3.4.lan": "Should be blocked: access to LAN",
    "3.4.mgmt": "Should be blocked: access to Proxmox management",
}

_NFT = "roles/sandbox_network/templates/nftables.nft.j2"
_LXC_CONF = "roles/template_build/templates/lxc.conf.j2"
_LXC = "sandbox_rt/backends/lxc/"
_LXC_BACKEND = _LXC + "backend.py"
_LXC_IDENTITY = "sandbox_rt/backends/lxc/identity.py"
_LXC_CGROUPS = "sandbox_rt/backends/lxc/cgroups.py"
_SECCOMP = "roles/template_build/files/sandbox.seccomp"
_PVE_RAW = "roles/template_build/tasks/proxmox/confine.yml (PVE: raw lxc.* keys)"


@dataclasses.dataclass(frozen=True)
class Control:
    id: str
    title: str
    checks: str  # what the test checks (state and behaviour)
    seed: tuple[str, ...]  # SEED_CHECKLIST keys; () = beyond the seed (DESIGN.md section 5)
    enforced: tuple[str, ...]  # where: role task/template or runtime code, by path


def _c(id_: str, title: str, checks: str, seed: tuple[str, ...], *enforced: str) -> Control:
    return Control(id_, title, checks, seed, tuple(enforced))


# fmt: off
CONTROLS: tuple[Control, ...] = (
    # -- the sandbox user -----------------------------------------------------------------------
    _c("SBX-USER-01", "sandbox user is unprivileged",
       "uid/gid 1000, only its own group, no capabilities, locked password, private home",
       (), "roles/sandbox_template/tasks/user.yml"),
    _c("SBX-USER-02", "sandbox user has no sudo",
       "`sudo -n true` fails, `sudo -l -U sandbox` says not allowed, no sudoers entry, no privileged group",
       (), "roles/sandbox_template/tasks/user.yml"),
    _c("SBX-USER-03", "root has no password",
       "root's shadow password is locked (`*`/`!`)",
       (), "roles/sandbox_template/tasks/user.yml"),
    _c("SBX-USER-04", "only the runtime's key logs in, from a file the sandbox cannot write",
       "`sshd -T`: AuthorizedKeysFile /etc/ssh/authorized_keys/%u; that dir root 0755, the file root 0644 "
       "holding only the runtime's key with `restrict`; the user cannot append to, replace or add beside "
       "it; a key the user writes into ~/.ssh logs nobody in; no key files in homes",
       (), "roles/sandbox_template/tasks/user.yml", "roles/sandbox_template/templates/sshd_config.j2",
       "roles/sandbox_runtime"),
    # -- sshd -------------------------------------------------------------------------------------
    _c("SBX-SSH-01", "sshd refuses root",
       "`sshd -T`: permitrootlogin no; root with the runtime's key is refused; the root login files "
       "/sbin/sandbox-init writes only in a root=True sandbox (SBX-ESC-27) are absent",
       (), "roles/sandbox_template/templates/sshd_config.j2"),
    _c("SBX-SSH-02", "sshd refuses passwords",
       "`sshd -T`: password/keyboard-interactive off, publickey only; a password login is not even offered",
       (), "roles/sandbox_template/templates/sshd_config.j2"),
    _c("SBX-SSH-03", "only the sandbox user may log in",
       "`sshd -T`: allowusers sandbox; another user with the runtime's key is refused",
       (), "roles/sandbox_template/templates/sshd_config.j2"),
    _c("SBX-SSH-04", "no SSH forwarding or tunnels",
       "`sshd -T`: no TCP/stream/agent/X11 forwarding, no tunnels, no user environment; a direct-tcpip "
       "channel is refused",
       (), "roles/sandbox_template/templates/sshd_config.j2"),
    _c("SBX-SSH-05", "one per-clone ed25519 host key, pinned",
       "`sshd -T` lists only the ed25519 key; the key served is the one the runtime pinned; "
       "an unknown key is rejected",
       (), "roles/sandbox_template/templates/sshd_config.j2", _LXC_IDENTITY + " (seed_identity)",
       "sandbox_rt/ssh/connection.py"),
    _c("SBX-SSH-06", "sshd session and auth limits",
       "`sshd -T`: maxsessions, maxstartups, maxauthtries, logingracetime as the role defaults, usedns no",
       (), "roles/sandbox_template/templates/sshd_config.j2"),
    # -- login limits -----------------------------------------------------------------------------
    _c("SBX-LIM-01", "process limit nproc 256/512",
       "a login gets soft/hard nproc 256/512 (pam_limits) and cannot raise them",
       ("7.sec.nproc",), "roles/sandbox_template/templates/limits.conf.j2",
       "roles/sandbox_template/tasks/sshd.yml (pam_limits)"),
    _c("SBX-LIM-02", "open-file limit nofile 4096/8192",
       "a login gets soft/hard nofile 4096/8192 and cannot raise them",
       (), "roles/sandbox_template/templates/limits.conf.j2"),
    _c("SBX-LIM-03", "no core dumps",
       "core 0/0 and not raisable; a crashing process leaves no core; host fs.suid_dumpable=0 and "
       "kernel.core_pattern is no pipe to an arbitrary helper",
       ("7.sec.core",), "roles/sandbox_template/tasks/limits.yml", "roles/lxc_host/defaults/main.yml"),
    # -- services, identity, PID 1 ---------------------------------------------------------------
    _c("SBX-SVC-01", "services that must be off are off",
       "only tini and sshd run besides the session, only :22 listens; units masked where systemd exists",
       (), "roles/sandbox_template/tasks/services.yml", "roles/sandbox_template/templates/sandbox-init.j2"),
    _c("SBX-ID-01", "no template host keys reused",
       "no host key in the template; two clones serve different host keys",
       (), "roles/sandbox_template/tasks/identity.yml", _LXC_IDENTITY + " (seed_identity)"),
    _c("SBX-ID-02", "own machine-id per clone",
       "the template's machine-id is empty; two clones have different machine-ids",
       (), "roles/sandbox_template/tasks/identity.yml", _LXC_IDENTITY + " (seed_identity)"),
    _c("SBX-ID-03", "own host name per clone",
       "`hostname` is the sandbox's name and /etc/hosts maps it; the template keeps a baseline",
       (), "roles/sandbox_template/tasks/identity.yml", _LXC_IDENTITY + " (seed_identity)"),
    _c("SBX-ID-04", "the only resolver is the host's dnsmasq",
       "/etc/resolv.conf names only the bridge address (template and clone)",
       (), "roles/sandbox_template/tasks/identity.yml", _LXC_IDENTITY + " (seed_identity)"),
    _c("SBX-INIT-01", "PID 1 is tini running sshd",
       "PID 1 is `tini -- sshd -D -e`; /sbin/sandbox-init is root's, 0755, not writable by the user",
       (), "roles/sandbox_template/tasks/init.yml", "roles/sandbox_template/templates/sandbox-init.j2",
       _PVE_RAW + " (lxc.init.cmd)"),
    # -- network ----------------------------------------------------------------------------------
    _c("SBX-NET-01", "the bridge has no physical port",
       "every port of the bridge is a veth; the bridge has its fixed MAC",
       ("7.net.bridge",), "roles/sandbox_network/tasks/bridge_iproute.yml",
       "roles/sandbox_network/templates/interfaces.j2"),
    _c("SBX-NET-02", "the firewall is loaded",
       "tables inet/bridge sandbox live, forward policy drop with explicit drops, input jumps to "
       "from_sandbox, set internet_allowed exists; other tables untouched",
       ("7.net.loaded",), "roles/sandbox_network/tasks/nftables.yml", _NFT),
    _c("SBX-NET-03", "the firewall persists across reboots",
       "systemd hosts: sandbox-nftables.service enabled (waived where there is no systemd)",
       ("7.net.persist",), "roles/sandbox_network/tasks/nftables.yml",
       "roles/sandbox_network/templates/sandbox-nftables.service.j2"),
    _c("SBX-NET-04", "no internet by default",
       "a new sandbox is not in internet_allowed and HTTP(S) to the wan fails while the host reaches it",
       ("7.net.deny", "7.fn.noinet", "3.4.http"), _NFT + " (forward)", "sandbox_rt/manager.py (create)"),
    _c("SBX-NET-05", "the internet toggle works both ways",
       "set_internet(True): HTTP by name works; False: blocked again and an open connection dies",
       ("7.net.http", "7.fn.inet"), _LXC + "nft.py", _LXC_BACKEND + " (set_internet: conntrack -D)",
       _NFT + " (forward, postrouting)"),
    _c("SBX-NET-06", "with internet only the allowed TCP ports",
       "with internet, wan TCP 80/443 open, other wan ports (8080, 22) blocked",
       ("7.net.http",), _NFT + " (forward: tcp dport)", "roles/sandbox_network/defaults/main.yml"),
    _c("SBX-NET-07", "no LAN",
       "TCP and ICMP (as container root) to the lan fail, with internet too, while the host reaches it",
       ("7.fn.lan", "3.4.lan"), _NFT + " (forward: blocked_destinations)"),
    _c("SBX-NET-08", "no sandbox to sandbox",
       "TCP and ICMP between two sandboxes fail both ways; the host reaches both",
       ("7.fn.cross",), _NFT + " (table bridge: sbx* ports; inet forward: 10.0.0.0/8)",
       _LXC_BACKEND + " (veth.pair = sbx...)"),
    _c("SBX-NET-09", "no host services but DNS/DHCP",
       "host listeners on the bridge address (:22, :8006, ...) are unreachable from a sandbox",
       ("7.net.mgmt", "3.4.mgmt"), _NFT + " (input: from_sandbox)"),
    _c("SBX-NET-10", "no link-local / cloud metadata",
       "169.254.169.254 is unreachable even with internet and a route to it",
       (), _NFT + " (forward: blocked_destinations)"),
    _c("SBX-NET-11", "DNS only via the host, only with internet",
       "without internet no DNS at all; with internet the host's dnsmasq resolves; any other resolver "
       "(UDP and TCP) is unreachable (stricter than the seed's DNS for all: DESIGN.md section 3)",
       ("7.net.dns", "3.4.dns"), _NFT + " (input: from_sandbox; forward)",
       "roles/sandbox_network/templates/dnsmasq.conf.j2",
       "sandbox_rt/backends/proxmox/firewall.py (PVE: the CT firewall's internet rules)"),
    _c("SBX-NET-12", "no IPv6 egress",
       "IPv6 off on the bridge, dropped in forward/input, no global address or route in the sandbox, "
       "container root cannot add one",
       (), "roles/sandbox_network/tasks/bridge_iproute.yml", _NFT, _LXC_CONF + " (cap.drop net_admin)"),
    _c("SBX-NET-13", "new connections rate-limited",
       "a burst of 200 connects gets at most ~50/s through; the host's own burst is not limited",
       ("7.net.rate",), _NFT + " (caps: new_connection_rate)"),
    _c("SBX-NET-14", "a scan finds nothing but allowed ports",
       "a TCP connect sweep of every bridge address the test made finds nothing (DNS on the host only "
       "with internet), while the host's sweep finds the sandboxes' sshd",
       ("7.fn.nmap",), _NFT),
    _c("SBX-NET-15", "no source address spoofing",
       "container root of a sandbox without internet cannot send a packet under the address of one with "
       "internet (the host must not forward it)",
       (), "roles/template_build/defaults/main.yml (template_build_cap_drop: net_raw)",
       _LXC_BACKEND + " (per-port address binding)"),
    _c("SBX-NET-16", "egress allow-list reaches only what it lists",
       "with internet off and egress=[name, address], the sandbox reaches the name's address (resolved by "
       "its own resolver into its own set) and the address on allowed ports, nothing else; another "
       "sandbox gains nothing; only the host resolver answers; set_egress([]) closes it",
       (), _NFT + " (egress_sources, dns_resolvers)", _LXC + "netstate.py", _LXC + "egress_dns.py"),
    _c("SBX-NET-17", "a firewall reload or DNS restart keeps every sandbox's state",
       "reloading the nft file and restarting the sandbox dnsmasq while sandboxes run restores internet and "
       "egress from the runtime's state files; the sandbox without internet stays cut off and isolated",
       (), _NFT + " (include net_state_dir/*.nft)", "sandbox_rt/backends/lxc/netstate.py"),
    _c("SBX-NET-18", "DNS answers only what the egress list allows",
       "a sandbox with names in its egress list gets answers for those only: other names (also one only "
       "another sandbox lists) are refused by the host and never reach the upstream resolver (its log); "
       "the listed name resolves into the sandbox's own set; a list change restarts no other resolver",
       (), _NFT + " (prerouting: dnat to @dns_resolvers)", "sandbox_rt/backends/lxc/egress_dns.py",
       "sandbox_rt/backends/lxc/netstate.py"),
    _c("SBX-NET-19", "a sandbox's port carries only its own MAC and address, ARP included",
       "container root, as the template makes it and with net_admin + net_raw granted on purpose (a "
       "throw-away variant), cannot send under a neighbour's address (a forged DNS query never reaches the "
       "host's conntrack), make the host's ARP entry for it point elsewhere, or teach the bridge its MAC",
       (), _NFT + " (table bridge: port_in / port_out)", "sandbox_rt/backends/lxc/netstate.py (_port_create)",
       _LXC_BACKEND + " (clone: the port is bound before start)"),
    # -- resources --------------------------------------------------------------------------------
    _c("SBX-RES-01", "fork bombs stay inside the pids limit",
       "pids.max as requested; a bounded fork bomb hits it, the sandbox survives, the host still forks",
       ("7.fn.forkbomb",), _LXC_CGROUPS + " (cgroup_limit_lines)", _LXC_CONF + " (default pids.max)",
       "roles/proxmox_hookscript/files/sandbox-rt-hookscript.pl (PVE: post-start)"),
    _c("SBX-RES-02", "memory hogs are OOM-killed inside",
       "allocating > the limit is killed in the sandbox, which survives; host free memory unaffected",
       ("7.fn.oom",), _LXC_CGROUPS + " (cgroup_limit_lines)"),
    _c("SBX-RES-03", "no swap",
       "memory+swap limit equals the memory limit (swap.max 0 on cgroup v2)",
       ("7.ct.swap",), _LXC_CGROUPS + " (cgroup_limit_lines)"),
    _c("SBX-RES-04", "CPU hogs stay within the quota",
       "two busy loops in a cpus=0.5 sandbox get <= ~0.6 CPU-seconds per second",
       (), _LXC_CGROUPS + " (cgroup_limit_lines)"),
    _c("SBX-RES-05", "disk fill stops at the disk size",
       "half of disk_gb can be written, more than disk_gb fails with EDQUOT/ENOSPC "
       "(waived with lxc_host_storage dir: the test shows the gap instead)",
       (), _LXC_BACKEND + " (btrfs subvolume + qgroup limit)", "roles/lxc_host/tasks/storage.yml"),
    _c("SBX-RES-06", "conntrack entries per sandbox are capped",
       "nf_conntrack_max holds the promised density at the cap; a sandbox sending new flows from every local "
       "port for 16 s holds at most sandbox_network_conntrack_per_sandbox (1024) entries",
       (), _NFT + " (caps: ct count, ct timeout sandbox_tcp)", "roles/sandbox_network/tasks/conntrack.yml"),
    _c("SBX-RES-07", "DNS queries per sandbox are rate-limited",
       "a sandbox flooding the host's dnsmasq for 2 s gets at most rate x time + burst answers; a neighbour "
       "asking 20 times meanwhile loses none",
       (), _NFT + " (caps: dns_query_rate; bridge prerouting: dns_port_rate)"),
    _c("SBX-RES-08", "new connections to the host are rate-limited too",
       "300 new flows to the host's DHCP port at once: at most the burst plus the rate reach the host "
       "(SBX-NET-13: forwarded ones)",
       (), _NFT + " (caps: new_connection_rate)"),
    _c("SBX-RES-09", "network bandwidth per sandbox",
       "with net_mbps=80, TCP both ways between host and sandbox averages no more than the cap allows (one "
       "second's bucket plus the rate); the runtime's SSH session is not counted",
       (), "sandbox_rt/backends/lxc/netstate.py (_port_create: policers)", "sandbox_rt/caps.py"),
    _c("SBX-RES-10", "disk bandwidth and IOPS per sandbox",
       "blkio.throttle.* (v1) / io.max (v2) on the storage device as asked; O_DIRECT writes of 1 MiB and "
       "4 KiB blocks stay within disk_mbps and disk_iops (buffered writes: docs/threat-model.md)",
       (), _LXC_CGROUPS + " (cgroup_limits)", "sandbox_rt/backends/lxc/hostcaps.py (storage_device)",
       "roles/lxc_host/tasks/storage.yml (loop direct IO)",
       "roles/proxmox_hookscript/files/sandbox-rt-hookscript.pl (PVE: post-start)"),
    _c("SBX-RES-11", "the sandboxes' pids limits together leave the host its pids",
       "kernel.pid_max holds the promised density at the default pids_max; a create past the budget "
       "(7/8 of pid_max, summed over the sandboxes' pids_max) is refused and leaves nothing; PVE: the "
       "node's hookscript sums its CTs' pids.max at post-start and refuses one past the node's budget",
       (), "sandbox_rt/backends/lxc/hostcaps.py (check_pids_budget)",
       "roles/lxc_host/defaults/main.yml (pid_max)",
       "roles/proxmox_hookscript/files/sandbox-rt-hookscript.pl (PVE: check_pids_budget)"),
    _c("SBX-RES-12", "a sandbox sees its own memory and CPUs",
       "/proc/meminfo, free, nproc, os.cpu_count(), /proc/cpuinfo, /proc/stat show its limits, /proc/uptime "
       "its own (lxcfs, bound in without hooks; cpus pinned to ceil(cpus) cores)",
       (), _LXC_CONF + " (lxc.mount.entry lxcfs)", "roles/lxc_host/tasks/lxcfs.yml",
       "sandbox_rt/backends/lxc/hostcaps.py (pick_cpus)"),
    _c("SBX-RES-13", "root inside cannot leave its limits through the cgroup tree",
       "in a root=True sandbox, root over the runtime's SSH makes a child cgroup and moves itself into it "
       "(blkio, cpu, memory, pids); from that shell O_DIRECT writes stay within disk_mbps and disk_iops, "
       "1 GiB is OOM-killed within memory_mb, a fork storm stops below pids_max, two busy loops stay within "
       "cpus; every cgroup hierarchy root sees is mounted read-only and each move is refused (cgroup v1's "
       "blkio throttle binds no child group: a writable tree let root write at 441 MB/s against 100)",
       (), _LXC_CONF + " (mount.auto cgroup:ro)", _LXC_CGROUPS + " (CGROUP_MOUNT: every clone)",
       _PVE_RAW + " (lxc.mount.auto)"),
    # -- escape -----------------------------------------------------------------------------------
    _c("SBX-ESC-01", "unprivileged container, ids of its own",
       "idmap 0 -> a 65536-id host range at or above 100000 in the config, PID 1 runs as its first "
       "host uid; on the embedded default each sandbox's range is its own (from its address); "
       "two sandboxes' maps are disjoint and one's root cannot read the other's files "
       "(tests/integration/runtime/test_idmap.py, with a negative proof)",
       ("7.ct.unprivileged",), _LXC_CONF + " (lxc.idmap)", "sandbox_rt/backends/lxc/idmap.py",
       "roles/lxc_host/tasks/idmap.yml"),
    _c("SBX-ESC-02", "no mounts",
       "mounting the host's disk, tmpfs, bind or proc fails as the user and as container root",
       ("7.fn.escape",), _LXC_CONF + " (cap.drop sys_admin, devices)"),
    _c("SBX-ESC-03", "no kernel log",
       "no /dev/kmsg, dmesg and /proc/kmsg denied (user and root); host kernel.dmesg_restrict=1",
       (), _LXC_CONF + " (autodev, cap.drop syslog)", "roles/lxc_host/defaults/main.yml"),
    _c("SBX-ESC-04", "no raw block devices",
       "no block device in /dev, mknod denied, the devices cgroup allows no block access",
       (), _LXC_CONF + " (devices.deny = a)"),
    _c("SBX-ESC-05", "no setuid shells or interpreters",
       "no setuid/setgid file named like a shell or interpreter",
       (), "roles/sandbox_template/tasks/escalation.yml"),
    _c("SBX-ESC-06", "/proc/sys and /sys are read-only",
       "writes to /proc/sys, /sys and /proc/sysrq-trigger fail as container root",
       (), _LXC_CONF + " (mount.auto proc:mixed sys:mixed)"),
    _c("SBX-ESC-07", "no kernel modules",
       "init_module/finit_module/delete_module get the filter's EPERM as the user (and the loaded filter "
       "answers them so) and fail as container root; sys_module not in the bounding set (both backends)",
       (), _LXC_CONF + " (cap.drop sys_module)", _SECCOMP),
    _c("SBX-ESC-08", "no user namespaces",
       "`unshare -Ur` fails as the user and container root; unshare/clone with CLONE_NEWUSER get the "
       "filter's EPERM, clone3 its ENOSYS (libc falls back to clone); a plain fork passes (both backends)",
       (), _SECCOMP, "roles/lxc_host/defaults/main.yml (kernel.unprivileged_userns_clone=0)"),
    _c("SBX-ESC-09", "the host's /proc is invisible",
       "a marker process on the host is not visible; PID 1 is the sandbox's own",
       (), "LXC pid namespace (" + _LXC_CONF + ")"),
    _c("SBX-ESC-10", "capabilities dropped",
       "lxc.cap.drop lists the role's set; PID 1's bounding set lacks each; the user has none",
       ("7.sec.caps",), _LXC_CONF + " (lxc.cap.drop)", "roles/template_build/defaults/main.yml",
       _PVE_RAW + " (lxc.cap.drop)", "roles/sandbox_template/templates/sandbox-init.j2 (PVE: setpriv)"),
    _c("SBX-ESC-11", "our seccomp profile is loaded",
       "lxc.seccomp.profile is the role's file, installed unchanged; PID 1 and user processes are "
       "filtered (Seccomp 2); the loaded filter answers umount2 with EPERM (both backends)",
       (), _LXC_CONF + " (lxc.seccomp.profile)", "roles/template_build/tasks/kernel.yml", _SECCOMP,
       _PVE_RAW + " (lxc.seccomp.profile)"),
    _c("SBX-ESC-12", "no nesting",
       "no nesting include, no rw proc/sys/cgroup mounts; container root cannot change its own "
       "cgroup limits or mount proc",
       ("7.ct.nesting",), _LXC_CONF + " (mount.auto cgroup:ro)"),
    _c("SBX-ESC-13", "AppArmor profile lxc-container-default-cgns",
       "where AppArmor is enabled: PID 1 is confined by it (waived where the kernel has no AppArmor)",
       ("7.sec.apparmor",), _LXC_CONF + " (lxc.apparmor.profile)",
       "roles/template_build/tasks/lxc/config.yml"),
    _c("SBX-ESC-14", "second lock: no user namespaces even without the filter",
       "user.max_user_namespaces is 0 inside the sandbox (a start-host hook sets it in the sandbox's "
       "user namespace; on PVE the CT setup mount hook); neither the user nor container root can raise "
       "it (both backends)",
       (), _LXC_CONF + " (lxc.hook.start-host)", "roles/template_build/files/sandbox-rt-userns-lock",
       _PVE_RAW + " (lxc.hook.mount)", "roles/template_build/files/sandbox-rt-pve-ct-setup"),
    _c("SBX-ESC-15", "no namespace switching",
       "setns, unshare (mount, net) and clone with a namespace flag get the filter's EPERM (both backends)",
       (), _SECCOMP),
    _c("SBX-ESC-16", "no kernel keyring",
       "keyctl, add_key, request_key get the filter's EPERM (both backends)", (), _SECCOMP),
    _c("SBX-ESC-17", "no io_uring",
       "io_uring_setup/enter/register get the filter's EPERM (both backends)", (), _SECCOMP),
    _c("SBX-ESC-18", "no userfaultfd",
       "userfaultfd (also user-mode-only) gets the filter's EPERM (both backends)", (), _SECCOMP),
    _c("SBX-ESC-19", "no bpf",
       "bpf gets the filter's EPERM (both backends)", (), _SECCOMP),
    _c("SBX-ESC-20", "no perf events",
       "perf_event_open gets the filter's EPERM (both backends)", (), _SECCOMP),
    _c("SBX-ESC-21", "no mount calls",
       "mount, umount2, pivot_root and the new mount API (open_tree, move_mount, fsopen, fsconfig, fsmount, "
       "fspick, mount_setattr) get the filter's EPERM (both backends)", (), _SECCOMP),
    _c("SBX-ESC-22", "no clock setting",
       "settimeofday, clock_settime get the filter's EPERM (both backends)", (), _SECCOMP),
    _c("SBX-ESC-23", "no ptrace family",
       "ptrace, process_vm_readv/writev, kcmp, pidfd_getfd, process_madvise get the filter's EPERM, even "
       "on the caller itself (both backends)", (), _SECCOMP),
    _c("SBX-ESC-24", "no reboot or kexec",
       "reboot, kexec_load, kexec_file_load get the filter's EPERM (both backends)", (), _SECCOMP),
    _c("SBX-ESC-25", "no host administration calls",
       "swapon/off, acct, quotactl, syslog, sethostname, setdomainname, open_by_handle_at, iopl, ioperm, "
       "lookup_dcookie, fanotify_init, NUMA policy calls, AF_ALG and AF_VSOCK sockets get the filter's "
       "EPERM (both backends)", (), _SECCOMP),
    _c("SBX-ESC-26", "no new privileges",
       "lxc.no_new_privs = 1 (PVE refuses the key: /sbin/sandbox-init sets the flag); PID 1 and the "
       "user's shell carry NoNewPrivs; setuid sudo stops at the flag (both backends)",
       (), _LXC_CONF + " (lxc.no_new_privs)",
       "roles/sandbox_template/templates/sandbox-init.j2 (PVE: setpriv)"),
    _c("SBX-ESC-27", "root on request stays confined",
       "in a sandbox made with root=True, root over the runtime's SSH is uid 0 of the unprivileged "
       "container with exactly Docker's default capabilities less net_raw (CapEff and CapBnd), "
       "NoNewPrivs and the filter; every kernel-surface call the filter refuses is refused to it, "
       "mounts, modules, user namespaces and /proc/sys writes fail, and it can change neither its "
       "address nor its MAC nor open raw sockets (both backends)",
       (), _LXC_CONF + " (lxc.cap.drop)", "roles/sandbox_template/templates/sandbox-init.j2",
       "sandbox_rt/backends/records.py (ROOT_ENV)"),
    _c("SBX-ESC-28", "nothing runs as root without root",
       "in a sandbox made without root no process has uid 0 in any of its ids (PID 1, sshd, logins, "
       "commands, terminals, background processes; read from the host's /proc): its init starts as the "
       "sandbox user (lxc.init.uid/gid, the login limits as lxc.prlimit.*), sshd runs as that user, "
       "port 22 is open to it, its host key is its own; so nothing a template step or a root sandbox's "
       "snapshot planted runs as root (tests/integration/runtime/test_root_rule.py). PVE: waived, "
       "root-tainted sources need root=True there",
       (), "sandbox_rt/backends/lxc/userinit.py", "roles/sandbox_template/templates/sandbox-init.j2",
       "roles/template_build/files/sandbox-rt-sshd-port"),
    # -- access -----------------------------------------------------------------------------------
    _c("SBX-ACC-01", "the runtime's credential is scoped",
       "LXC: the SSH key is root-only and only logs in as `sandbox`; PVE: the API token is confined to "
       "the sandbox pool (waived on LXC: there is no API token)",
       ("7.ct.pool",), "roles/sandbox_runtime", "roles/proxmox_access"),
    # -- lifecycle --------------------------------------------------------------------------------
    _c("SBX-LIFE-01", "destroy leaves nothing",
       "container dir, overlay delta, cgroups, veth, address, nft element, port binding (its bridge chains "
       "and map elements), conntrack and lease are gone",
       ("7.fn.cleanup", "7.op.destroy"), _LXC_BACKEND + " (destroy)"),
    _c("SBX-LIFE-02", "orphans are collected",
       "a caller SIGKILLed mid-create or mid-session leaves nothing `gc` does not remove",
       ("7.op.orphan",), "sandbox_rt/manager.py (gc)", _LXC_BACKEND + " (gc_candidates)"),
    _c("SBX-LIFE-03", "clone, start, SSH, commands",
       "create reaches SSH-ready within seconds; commands run; a second process can attach",
       ("7.op.ssh",), "sandbox_rt/manager.py (create)", "sandbox_rt/ssh/executor.py"),
    _c("SBX-LIFE-04", "SFTP upload and download",
       "a file and a directory round-trip byte for byte",
       ("7.op.sftp",), "sandbox_rt/sandbox.py", "sandbox_rt/ssh/executor.py"),
    _c("SBX-LIFE-05", "destroy forgets the network state",
       "the sandbox's state files, dnsmasq nftset lines, egress chain and sets, and its elements in the "
       "internet set, egress map and DNS clients set are gone",
       (), "sandbox_rt/backends/lxc/netstate.py (remove)", _LXC_BACKEND + " (destroy)"),
)

# fmt: on

BY_ID: dict[str, Control] = {c.id: c for c in CONTROLS}


def test_name_prefix(control_id: str) -> str:
    """``SBX-NET-03`` -> ``test_SBX_NET_03_`` (every control's one test starts so)."""
    return "test_" + control_id.replace("-", "_") + "_"


# -- waivers --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Waiver:
    control: str
    condition: str  # the name of a condition check in checks.WAIVER_CONDITIONS
    applies_to: str
    reason: str


# waivers.yml sections: ``waivers`` apply wherever their condition holds; ``pve_waivers`` only to
# PVE-backed sandboxes (the catalogue's pve-node site), whose tests consult them as pve_waivers[...].
SECTIONS = ("waivers", "pve_waivers")


def load_waivers(path: Path = WAIVERS_FILE, section: str = "waivers") -> dict[str, Waiver]:
    assert section in SECTIONS, section
    data: dict[str, Any] = yaml.safe_load(path.read_text()) or {}
    out: dict[str, Waiver] = {}
    for control, entry in (data.get(section) or {}).items():
        out[control] = Waiver(
            control,
            str(entry["condition"]),
            " ".join(str(entry["applies_to"]).split()),
            " ".join(str(entry["reason"]).split()),
        )
    return out


# -- the generated table --------------------------------------------------------------------------
def render_markdown() -> str:
    waivers = load_waivers()
    pve_waivers = load_waivers(section="pve_waivers")
    lines = [
        "# Hardening controls",
        "",
        "<!-- Generated by `python -m tests.hardening.controls > docs/controls.md`; do not edit. -->",
        "",
        "Every control has one test in `tests/hardening/` named after its id (`test_SBX_NET_04_...`);",
        "state checks run through testinfra (the sandbox over SSH with its host key pinned, container root",
        "through `lxc-attach`, the host locally), behaviour on real sandboxes with a simulated internet and",
        "LAN made by the tests (`tests/hardening/testnet.py`). Run: `pytest tests/hardening` (root, a host",
        "prepared by `site.yml`). Task names and tags of the roles carry the same ids",
        "(`ansible-playbook site.yml --tags SBX-SSH`). Each control test runs on two sites: the embedded",
        "default (`lxc`) and PVE-backed sandboxes on the emulated Proxmox VE node (`pve-node`,",
        "`tests/pve_node`; `tests/hardening/sites.py`); where a control cannot hold on PVE, its",
        "`pve_waivers` entry says why and its test asserts that instead.",
        "",
        "| id | control | checks | seed checklist | enforced in |",
        "|---|---|---|---|---|",
    ]
    for c in CONTROLS:
        seed = "; ".join(f"{k}: {SEED_CHECKLIST[k]}" for k in c.seed) or "(beyond the seed)"
        title = c.title + (" **(waived, see below)**" if c.id in waivers else "")
        title += " **(PVE: waived, see below)**" if c.id in pve_waivers else ""
        enforced = "<br>".join(f"`{e}`" for e in c.enforced)
        lines.append(f"| {c.id} | {title} | {c.checks} | {_cell(seed)} | {enforced} |")
    lines += ["", "## Seed checklist coverage", "", "| seed item | controls |", "|---|---|"]
    for key, text in SEED_CHECKLIST.items():
        ids = ", ".join(c.id for c in CONTROLS if key in c.seed)
        lines.append(f"| {key}: {_cell(text)} | {ids} |")
    lines += ["", *seccomp_profile.render_markdown().splitlines()]
    lines += ["", "## Waivers (`tests/hardening/waivers.yml`)", ""]
    lines.append(
        "A waived control's test still runs: it asserts the waiver's condition and fails when the "
        "condition no longer holds (then the real check applies)."
    )
    lines.append("")
    for w in waivers.values():
        lines.append(f"- **{w.control}** ({BY_ID[w.control].title}), applies to {w.applies_to}: {w.reason}")
    pve = load_waivers(section="pve_waivers")
    if pve:
        lines += ["", "### On Proxmox VE (`pve_waivers`)", ""]
        lines.append(
            "The catalogue runs on PVE-backed sandboxes too (the `pve-node` site: the emulated PVE node of "
            "`tests/pve_node`). These controls cannot hold there as on the embedded default; each test "
            "asserts what the waiver states instead."
        )
        lines.append("")
        for w in pve.values():
            title = BY_ID[w.control].title
            lines.append(f"- **{w.control}** ({title}), applies to {w.applies_to}: {w.reason}")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def main() -> int:
    sys.stdout.write(render_markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
