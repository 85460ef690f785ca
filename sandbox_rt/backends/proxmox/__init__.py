"""Proxmox VE: sandboxes as linked clones of a CT template, driven through the API with proxmoxer.

Modules: ``backend`` (the create steps, records, gc), ``core`` (the connection and every API call),
``description`` (what a CT carries as text: tags, record, host key), ``firewall`` (the CT firewall),
``snapshots``, ``placement`` (which node of a cluster takes a new sandbox).

Choices (see docs/proxmox.md):
- Identity: the sandbox id (``sbx-<hex>``) is a PVE tag; ``sandbox-rt`` tags every sandbox and
  ``exp-<epoch>`` carries its expiry, so ``gc`` finds them from ``/cluster/resources`` alone. The
  record (labels, owner, spec) is one JSON line of the CT's description, written by the clone call
  itself, so a CT is recognisably ours from its first moment. gc never touches a CT without that.
- Placement (``placement``): a linked clone lives on its template's node, so each node has its own
  copy of each template (``pve_node_templates``); a create goes to the online node with a copy and
  the most free memory, then the fewest sandboxes (``node=`` / ``pve_node`` pin one), and moves on
  to the next node within the call when one answers 595.
- Addresses: derived from the VMID, counted down from the top of the pool (the local LXC backend
  counts up from the bottom), then probed past any address another sandbox-rt CT uses.
- Host keys: a hookscript on the node writes a fresh ed25519 host key into the CT before its
  first start and publishes the public half in the description (``sandbox-rt-ssh-host-key:``);
  the runtime pins that before its first SSH contact and refuses a CT that has none.
- Internet: the CT's own PVE firewall (``net0 firewall=1``, outbound policy DROP, two outbound
  ACCEPT rules for DNS and HTTP/HTTPS that ``set_internet`` enables or disables); this needs only
  ``VM.Config.Network`` on the CT, no shell on the node. PVE applies CT firewalls only while the
  datacenter firewall is on: create, set_internet and set_egress check that first and fail closed
  (:class:`FirewallDisabled`).
- Every UPID is waited for and its exit status checked; "CT is locked" and VMID races are retried
  with back-off, then a BackendError with PVE's message.
"""

from .backend import ProxmoxBackend
from .description import HOSTKEY_PREFIX, RECORD_PREFIX, TAG

__all__ = ["HOSTKEY_PREFIX", "RECORD_PREFIX", "TAG", "ProxmoxBackend"]
