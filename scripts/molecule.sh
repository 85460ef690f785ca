#!/usr/bin/env bash
# Molecule: one scenario per role (molecule/<role>/), each destroy -> syntax -> create -> converge ->
# idempotence -> verify -> destroy against this machine (run as root; see docs/molecule.md).
#   ./scripts/molecule.sh                      every scenario, then a table of durations
#   ./scripts/molecule.sh sandbox_network ...  only these
# Every scenario runs even when an earlier one failed; the exit status is non-zero if any failed.
# SANDBOX_RT_MOLECULE_SCRATCH moves the scenarios' scratch root (default /tmp/sandbox_rt-molecule).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
if [[ ! -t 1 ]]; then export NO_COLOR=1 ANSIBLE_NOCOLOR=1; fi

if (($# > 0)); then
  scenarios=("$@")
else
  mapfile -t scenarios < <(find molecule -mindepth 2 -maxdepth 2 -name molecule.yml -printf '%h\n' | xargs -n1 basename | sort)
fi

declare -a results=()
failed=0
t_all=$SECONDS
for s in "${scenarios[@]}"; do
  echo "=== molecule: $s"
  t0=$SECONDS
  if molecule test --scenario-name "$s" --no-report; then r=passed; else r=FAILED; failed=1; fi
  results+=("$(printf '  %-20s %5ss  %s' "$s" $((SECONDS - t0)) "$r")")
done
echo "=== molecule durations"
printf '%s\n' "${results[@]}"
printf '  %-20s %5ss\n' total $((SECONDS - t_all))
exit "$failed"
