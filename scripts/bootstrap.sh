#!/usr/bin/env bash
# Installs what running the bundle needs on a fresh Debian 12 machine, as root:
# the few system packages Ansible needs, and a virtualenv (.venv) with the project and its dev extra.
# Everything else (lxc, nftables, dnsmasq, mmdebstrap, ...) is installed by the roles themselves.
# Idempotent and quick on a second run: it skips what is already in place.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $EUID -ne 0 ]]; then
  echo "bootstrap: run as root (e.g. sudo $0)" >&2
  exit 1
fi

apt_packages=(python3 python3-venv python3-dev gcc ca-certificates git tmux)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "bootstrap: apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Debian's own python: the same interpreter on every fresh Debian 12, whatever else is on PATH.
python=/usr/bin/python3
stamp=".venv/.bootstrap-$(sha256sum pyproject.toml | cut -c1-16)"
if [[ ! -f $stamp ]]; then
  echo "bootstrap: creating .venv and installing sandbox_rt[dev]"
  [[ -x .venv/bin/python ]] || "$python" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[dev]'
  rm -f .venv/.bootstrap-*
  touch "$stamp"
fi
echo "bootstrap: ready (.venv/bin/ansible-playbook, .venv/bin/sandbox-rt)"
