#!/usr/bin/env bash
# Molecule: one scenario per role (molecule/<role>/), each destroy -> syntax -> create -> converge ->
# idempotence -> verify -> destroy against this machine (run as root; see docs/molecule.md).
#   ./scripts/molecule.sh                      every scenario, in two lanes side by side (below),
#                                              then a table of durations
#   ./scripts/molecule.sh sandbox_network ...  only these, one after another
# Every scenario runs even when an earlier one failed; the exit status is non-zero if any failed.
# SANDBOX_RT_MOLECULE_SCRATCH moves the scenarios' scratch root (default /tmp/sandbox_rt-molecule).
# SANDBOX_RT_MOLECULE_LANES=1 runs every scenario in one lane, one after another.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
if [[ ! -t 1 ]]; then export NO_COLOR=1 ANSIBLE_NOCOLOR=1; fi

# A scenario is mostly one Ansible process on one core, and this kind of machine has two: two lanes
# run at once. Scenarios that share a host-wide name run in the same lane, one after another: the
# molbr0 bridge (sandbox_network, sandbox_template, template_build). The other lane's scenarios have
# only names of their own (scratch directory, emulated node index 1, the PVE API test server's port).
# A new scenario must be placed in a lane here.
LANES=(
  "sandbox_network sandbox_template template_build"
  "lxc_host proxmox_access proxmox_hookscript sandbox_network_pve sandbox_runtime"
)

run_lane() {  # run_lane RESULTS_FILE SCENARIO...: each scenario in turn, a result line each
  local results=$1 s t0 r
  shift
  for s in "$@"; do
    echo "=== molecule: $s"
    t0=$SECONDS
    if molecule test --scenario-name "$s" --no-report; then r=passed; else r=FAILED; fi
    printf '  %-20s %5ss  %s\n' "$s" $((SECONDS - t0)) "$r" >> "$results"
  done
}

work=$(mktemp -d)
: > "$work/results"
trap 'rm -rf "$work"' EXIT
t_all=$SECONDS
mapfile -t found < <(find molecule -mindepth 2 -maxdepth 2 -name molecule.yml -printf '%h\n' | xargs -n1 basename | sort)
if (($# > 0)) || [[ ${SANDBOX_RT_MOLECULE_LANES:-2} == 1 ]]; then
  if (($# > 0)); then scenarios=("$@"); else scenarios=("${found[@]}"); fi
  count=${#scenarios[@]}
  run_lane "$work/results" "${scenarios[@]}"
else
  placed=" ${LANES[*]} "
  for s in "${found[@]}"; do
    if [[ $placed != *" $s "* ]]; then
      echo "molecule.sh: scenario '$s' is in no lane: add it to LANES in $0" >&2
      exit 2
    fi
  done
  count=${#found[@]}
  pids=()
  for i in "${!LANES[@]}"; do
    # shellcheck disable=SC2086 # a lane is a list of names
    run_lane "$work/results" ${LANES[$i]} > "$work/lane$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    # A lane's own status says nothing about its scenarios (each has a result line, FAILED or
    # passed); a lane that died early is caught below by the count of result lines.
    wait "${pids[$i]}" || true
    echo "=== molecule lane $((i + 1)) of ${#LANES[@]}: ${LANES[$i]}"
    cat "$work/lane$i.log"
  done
fi
echo "=== molecule durations"
cat "$work/results"
printf '  %-20s %5ss\n' total $((SECONDS - t_all))
if grep -q FAILED "$work/results"; then exit 1; fi
# every scenario has a result line (a lane that died early leaves some without)
if [[ $(wc -l < "$work/results") -ne $count ]]; then echo "molecule.sh: a lane ended early" >&2; exit 1; fi
