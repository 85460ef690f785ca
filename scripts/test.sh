#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 root shell: installs what it needs (bootstrap),
# provisions this machine with site.yml, then runs lint and every pytest tier.
#   ./scripts/test.sh            everything (what CI runs)
#   ./scripts/test.sh --fast     lint + unit tests only (about a minute)
#   extra arguments after the options go to pytest, e.g. ./scripts/test.sh -k exec
set -euo pipefail
cd "$(dirname "$0")/.."

fast=0
if [[ ${1:-} == --fast ]]; then fast=1; shift; fi

declare -a stage_names=() stage_secs=()
stage() {  # stage NAME CMD...: run a stage, record how long it took
  local name=$1 t0=$SECONDS
  shift
  echo "=== stage: $name"
  "$@"
  stage_names+=("$name")
  stage_secs+=($((SECONDS - t0)))
}
report() {
  echo "=== stage durations"
  local i
  for i in "${!stage_names[@]}"; do printf '  %-12s %5ss\n' "${stage_names[$i]}" "${stage_secs[$i]}"; done
}

stage bootstrap ./scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
# A safety net that drops anything forwarded out of the machine's real uplink, where the
# workplace provides it (see DEVELOPERS.md, network safety).
if [[ -x ../shared/netguard ]]; then ../shared/netguard; fi

stage lint bash -c 'ruff check sandbox_rt pve_testserver tests benchmarks molecule && mypy && yamllint -s . \
  && ansible-lint --offline -q && echo lint ok'

if ((fast)); then
  marker=(-m "not slow")
else
  stage provision ansible-playbook -i inventories/local site.yml
  stage molecule ./scripts/molecule.sh
  marker=()
fi

t0=$SECONDS
set +e
python -m tests.lanes "${marker[@]}" -p no:cacheprovider --durations=15 "$@" 2>&1 | tee .pytest.log
rc=${PIPESTATUS[0]}
set -e
stage_names+=(pytest)
stage_secs+=($((SECONDS - t0)))
report
# the pytest summary again, as the last line
tail -n 1 .pytest.log
rm -f .pytest.log
exit "$rc"
