"""PVE's privileges and built-in roles (facts from pve-access-control, PVE 9).

PVE groups every privilege of a category into four buckets: ``root`` (only Administrator / root),
``admin``, ``user`` and ``audit``. The built-in roles are derived from those buckets:
``PVE<Cat>Admin`` and ``PVEAdmin`` get admin+user+audit, ``PVE<Cat>User`` gets user+audit (only if
the category has user privileges), ``PVEAuditor`` gets every audit privilege, ``Administrator``
gets everything, ``NoAccess`` nothing; ``PVEAdmin`` lacks ``Mapping.Modify``;
``PVETemplateUser`` is ``VM.Clone`` + ``VM.Audit``. The server tests check this list against the
privilege list in the API schema (``GET /access/roles/{roleid}`` returns one boolean per privilege).
"""

from __future__ import annotations

# category -> (root, admin, user, audit)
PRIV_GROUPS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "VM": (
        (),
        (
            "VM.Config.Disk",
            "VM.Config.CPU",
            "VM.Config.Memory",
            "VM.Config.Network",
            "VM.Config.HWType",
            "VM.Config.Options",
            "VM.Allocate",
            "VM.Clone",
            "VM.GuestAgent.Unrestricted",
            "VM.Migrate",
            "VM.Replicate",
            "VM.Snapshot",
            "VM.Snapshot.Rollback",
        ),
        (
            "VM.Config.CDROM",
            "VM.Config.Cloudinit",
            "VM.Console",
            "VM.Backup",
            "VM.GuestAgent.FileRead",
            "VM.GuestAgent.FileSystemMgmt",
            "VM.GuestAgent.FileWrite",
            "VM.PowerMgmt",
        ),
        ("VM.Audit", "VM.GuestAgent.Audit"),
    ),
    "Sys": (
        ("Sys.PowerMgmt", "Sys.Modify", "Sys.Incoming", "Sys.AccessNetwork"),
        ("Sys.Console", "Sys.Syslog"),
        (),
        ("Sys.Audit",),
    ),
    "Datastore": (
        (),
        ("Datastore.Allocate", "Datastore.AllocateTemplate"),
        ("Datastore.AllocateSpace",),
        ("Datastore.Audit",),
    ),
    "SDN": ((), ("SDN.Allocate", "SDN.Audit"), ("SDN.Use",), ("SDN.Audit",)),
    "User": (("Realm.Allocate",), ("User.Modify", "Group.Allocate", "Realm.AllocateUser"), (), ()),
    "Pool": ((), ("Pool.Allocate",), ("Pool.Audit",), ("Pool.Audit",)),
    "Mapping": ((), ("Mapping.Modify",), ("Mapping.Use",), ("Mapping.Audit",)),
}


def _all_privileges() -> frozenset[str]:
    privs = {"Permissions.Modify"}
    for root, admin, user, audit in PRIV_GROUPS.values():
        privs.update(root, admin, user, audit)
    return frozenset(privs)


PRIVILEGES: frozenset[str] = _all_privileges()


def _builtin_roles() -> dict[str, frozenset[str]]:
    roles: dict[str, set[str]] = {"NoAccess": set(), "Administrator": set(PRIVILEGES), "PVEAdmin": set()}
    auditor: set[str] = set()
    for cat, (_root, admin, user, audit) in PRIV_GROUPS.items():
        roles.setdefault(f"PVE{cat}Admin", set()).update(admin, user, audit)
        roles["PVEAdmin"].update(admin, user, audit)
        if user:
            roles.setdefault(f"PVE{cat}User", set()).update(user, audit)
        auditor.update(audit)
    roles["PVEAuditor"] = auditor
    roles["PVEAdmin"].discard("Mapping.Modify")
    roles["PVETemplateUser"] = {"VM.Clone", "VM.Audit"}
    return {name: frozenset(privs) for name, privs in roles.items()}


BUILTIN_ROLES: dict[str, frozenset[str]] = _builtin_roles()
