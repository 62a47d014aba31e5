#!/usr/bin/env bash
# Reproduces every number in docs/benchmarks.md: the fleet simulation of all ten routing policies on the two
# Mooncake traces and on the four built-in generators, each at three loads around the knee where
# round_robin's mean TTFT reaches 5x its unloaded TTFT; the timing of the whole conversation trace; the
# generators under a second seed; the saturated multi_turn cell and the shared_prefix cell at 0.75x the knee
# under four more seeds; and the two trace cells with the thinnest margins at nearby loads (the "bands").
#
#   scripts/bench.sh TRACE_DIR [OUT_DIR]
#   scripts/bench.sh family [OUT_DIR]
#
# `family` runs every policy on 50 workloads of the workload family (kvroute-bench simulate --workload family
# --seed N, N = 1..50, or the seeds in $SEEDS), writes OUT_DIR/family/seed_N.{json,txt} (each table opens with
# its draw), then judges kv_cost against the best other policy per figure: OUT_DIR/family/family.md (all seeds
# and the totals) and OUT_DIR/family/family_ratios.svg (kv_cost's ratio to the best, per figure).
#
# TRACE_DIR is the directory where you put the Mooncake traces (conversation_trace.jsonl and
# synthetic_trace.jsonl from https://github.com/kvcache-ai/Mooncake, folder FAST25-release/traces); without
# it only the generators run. OUT_DIR (default bench-results) receives one JSON file and one plot folder per
# workload and the tables as text. BUILD_DIR (default build-bench) is the CMake build directory used.
# PREFIX_COMMIT (default step-end) is passed to every simulation as --prefix-commit: schedule gives the
# figures docs/benchmarks.md quotes for vLLM's commit timing.
set -euo pipefail

TRACE_DIR="${1:-}"
OUT_DIR="${2:-bench-results}"
BUILD_DIR="${BUILD_DIR:-build-bench}"
PREFIX_COMMIT="${PREFIX_COMMIT:-step-end}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" --target kvroute-bench
BENCH="$BUILD_DIR/bin/kvroute-bench"
mkdir -p "$OUT_DIR"

if [[ "$TRACE_DIR" == family ]]; then
  dir="$OUT_DIR/family"
  mkdir -p "$dir"
  files=()
  for seed in ${SEEDS:-$(seq 1 50)}; do
    echo "== family seed $seed" >&2
    "$BENCH" simulate --workload family --seed "$seed" --workers 8 --model qwen3-8b --gpu h100-80gb \
      --prefix-commit "$PREFIX_COMMIT" --no-progress --json "$dir/seed_$seed.json" > "$dir/seed_$seed.txt"
    head -1 "$dir/seed_$seed.txt" >&2
    files+=("$dir/seed_$seed.json")
  done
  "$BENCH" family-summary --out "$dir" "${files[@]}"
  echo "results in $dir" >&2
  exit 0
fi

run() {  # [SEED=N] run NAME ARGS...: three loads around the knee, every policy, JSON + plots + table
  local name="$1"; shift
  echo "== $name" >&2
  "$BENCH" simulate "$@" --knee 5 --workers 8 --model qwen3-8b --gpu h100-80gb --seed "${SEED:-1}" \
    --prefix-commit "$PREFIX_COMMIT" --json "$OUT_DIR/$name.json" --plots "$OUT_DIR/$name" | tee "$OUT_DIR/$name.txt"
}

if [[ -n "$TRACE_DIR" ]]; then
  for trace in conversation_trace synthetic_trace; do
    if [[ ! -f "$TRACE_DIR/$trace.jsonl" ]]; then
      echo "missing $TRACE_DIR/$trace.jsonl (get it from kvcache-ai/Mooncake, FAST25-release/traces)" >&2
      exit 1
    fi
    run "$trace" --trace "$TRACE_DIR/$trace.jsonl"
  done
  # Bands: kv_cost and the runners-up of the closest trace cells (block_cost, e2) at loads around those cells,
  # to show how much of a cell's verdict is the draw of its exact rate scale.
  band() {  # band TRACE SCALES
    echo "== band: $1 at $2" >&2
    "$BENCH" simulate --trace "$TRACE_DIR/$1.jsonl" --sweep "$2" --policies kv_cost,block_cost,e2 --workers 8 \
      --model qwen3-8b --gpu h100-80gb --prefix-commit "$PREFIX_COMMIT" --no-progress \
      --json "$OUT_DIR/${1}_band.json" > "$OUT_DIR/${1}_band.txt"
  }
  band synthetic_trace 1.4,1.5,1.55,1.6,1.62,1.65,1.7,1.8,1.9,2.0,2.1,2.16,2.2,2.3,2.4
  band conversation_trace 1.8,1.93,2.1,2.3,2.57,2.7,2.9,3.0,3.1,3.21,3.3,3.4
  # Performance: the whole conversation trace, all ten policies, at the trace's own pace.
  echo "== timing: conversation_trace, all policies, rate scale 1" >&2
  /usr/bin/time -f "%e s wall, %U s user, %M KiB max RSS" "$BENCH" simulate \
    --trace "$TRACE_DIR/conversation_trace.jsonl" --prefix-commit "$PREFIX_COMMIT" --no-progress \
    > "$OUT_DIR/conversation_trace_timing.txt"
fi

for workload in shared_prefix multi_turn tenants zipf_tools; do
  run "$workload" --workload "$workload"
done

# The four generators again with another seed (their own knees), to check that kv_cost's standing is not the
# draw of seed 1.
for workload in shared_prefix multi_turn tenants zipf_tools; do
  SEED=2 run "${workload}_seed2" --workload "$workload"
done

# One cell under other seeds: the same generator and load, seeds 2-5, to show how much of that cell's ranking
# is the workload's draw.  other_seeds WORKLOAD RATE_SCALE
other_seeds() {
  local workload="$1" scale="$2" seed
  for seed in 2 3 4 5; do
    echo "== $workload, rate scale $scale, seed $seed" >&2
    "$BENCH" simulate --workload "$workload" --rate-scale "$scale" --workers 8 --model qwen3-8b --gpu h100-80gb \
      --seed "$seed" --prefix-commit "$PREFIX_COMMIT" --no-progress \
      --json "$OUT_DIR/${workload}_${scale}_seed$seed.json" | tee "$OUT_DIR/${workload}_${scale}_seed$seed.txt"
  done
}
other_seeds multi_turn 1.6     # the saturated cell: 1.25x the seed-1 knee
other_seeds shared_prefix 0.61  # the cell kv_cost misses on p99: 0.75x the seed-1 knee
echo "results in $OUT_DIR" >&2
