#!/usr/bin/env bash
# Every figure of docs/performance.md, measured again in one run: each bench
# with the arguments its table names, one after the other (they share the machine, so
# never two at once), the output of each under a heading. Needs root and PostgreSQL (as
# scripts/test.sh starts it); about 15 minutes a run, the 10-minute soak left out (run it
# with `python bench/soak.py --seconds 600`).
#
#   bash bench/figures.sh [OUT]      # OUT defaults to bench/figures-<date>.txt
#   FIGURES_RUNS=3 bash bench/figures.sh [OUT]   # three runs: OUT-run1.txt ... OUT-run3.txt
#
# Then it rewrites docs/performance.md's table of the hot path's targets from the FIGURE lines of the
# run(s), each figure the median over the runs (bench/perf_table.py): this machine's speed
# drifts by up to a half between runs, so several runs give the steadier table. The other
# tables are transcribed from such files, each naming the command it came from.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
runs="${FIGURES_RUNS:-1}"
base="${1:-bench/figures-$(date -u +%Y%m%d-%H%M).txt}"
base="${base%.txt}"
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
outs=()
for ((run = 1; run <= runs; run++)); do
    out="$base.txt"
    ((runs > 1)) && out="$base-run$run.txt"
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
    outs+=("$out")
done
"$python" bench/perf_table.py "${outs[@]}"
