"""The embedded default: plain LXC on this host, a package of one-job modules.

- ``backend``: :class:`LxcBackend`, the create steps (clone, start, update, destroy) and queries;
- ``cgroups``: the limits as cgroup files (config lines before start, live writes after), usage and
  the freezer;
- ``container``: reading and writing a container's LXC config (the keys the runtime writes per clone)
  and the runtime's record beside it;
- ``template_slots``: which container a template name, a sandbox or a snapshot is cloned from (the
  slots and their generations, ``generations``);
- ``identity``: what each clone gets of its own in its overlay delta (host key, machine-id, names),
  and a running one's new hostname;
- ``snapshots``: snapshots as copies of a sandbox's overlay delta, forks from them;
- ``netstate`` (one owner of the sandbox's nft state: port binding, internet, egress), ``nft`` (the
  ``nft`` tool), ``egress_dns`` (per-sandbox resolvers for egress names);
- ``idmap`` (isolated id maps), ``btrfs`` (disk limits), ``hostcaps`` (pids and CPU placement),
  ``fstree`` (bounded file tree walks that never follow a sandbox's links).
"""

from .backend import LxcBackend
from .cgroups import cgroup_limit_lines, cgroup_limits

__all__ = ["LxcBackend", "cgroup_limit_lines", "cgroup_limits"]
