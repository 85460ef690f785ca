#!/usr/bin/env bash
# The main job, end to end, on the embedded default (plain LXC on this Debian machine):
# install what is needed, provision the host and the hardened template with Ansible,
# then create a sandbox, run a command in it and destroy it.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
ansible-playbook -i inventories/local site.yml
sandbox-rt run -- uname -a
