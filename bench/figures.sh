#!/usr/bin/env bash
# Every figure of the README's "Performance" section, measured again in one run: each bench
# with the arguments its table names, one after the other (they share the machine, so
# never two at once), the output of each under a heading. Needs root and PostgreSQL (as
# scripts/test.sh starts it); about 20 minutes, the 10-minute soak left out (run it with
# `python bench/soak.py --seconds 600`).
#
#   bash bench/figures.sh [OUT]      # OUT defaults to bench/figures-<date>.txt
#
# Then it rewrites the README's table of issue 14's targets from the FIGURE lines of OUT
# (bench/readme_table.py); the other tables are transcribed from such a file, each naming
# the command it came from.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-bench/figures-$(date -u +%Y%m%d-%H%M).txt}"
python=.venv/bin/python
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/e2bfacade}"

benches=(
    "bench/create_floor_bench.py --n 60"
    "bench/create_floor_bench.py --n 60 --sqlite"
    "bench/runtime_bench.py --n 100 --idle 20"
    "bench/network_bench.py --n 150 --cycles 1000"
    "bench/sdk_bench.py --n 60"
    "bench/sdk_bench.py --sqlite"
    "bench/idempotency_bench.py -n 100"
    "bench/idempotency_bench.py -n 100 --sqlite"
    "bench/hotpath_bench.py --n 200 --rounds 3"
    "bench/list_bench.py --n 60"
    "bench/reconcile_bench.py --sandboxes 1000 --ticks 20"
    "bench/reconcile_bench.py --sandboxes 1000 --ticks 20 --sqlite"
    "bench/throughput_bench.py --clients 8,32 --seconds 5"
    "bench/purge_bench.py"
    "bench/dataplane_bench.py --n 100 --streams 100"
    "bench/code_interpreter_bench.py --n 200 --creates 20"
)
: > "$out"
for bench in "${benches[@]}"; do
    printf '\n## python %s   (%s)\n\n' "$bench" "$(date -u +%H:%M:%S)" | tee -a "$out"
    # The throughput bench measures sandbox creation alone: no network, as its table says.
    env_prefix=()
    [[ "$bench" == bench/throughput_bench.py* || "$bench" == bench/reconcile_bench.py* ]] \
        && env_prefix=(env SANDBOX_UPLINK=none)
    # shellcheck disable=SC2086 # the arguments are split on purpose
    if ! "${env_prefix[@]}" "$python" $bench 2>&1 | tee -a "$out"; then
        printf '\n(failed: %s)\n' "$bench" | tee -a "$out"
    fi
done
printf '\nfigures written to %s\n' "$out"
"$python" bench/readme_table.py "$out"
