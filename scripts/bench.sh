#!/usr/bin/env bash
# Reproduces every number in docs/benchmarks.md: the fleet simulation of all ten routing policies on the two
# Mooncake traces and on the four built-in generators, each at three loads around the knee where
# round_robin's mean TTFT reaches 5x its unloaded TTFT, plus the timing of the whole conversation trace.
#
#   scripts/bench.sh TRACE_DIR [OUT_DIR]
#
# TRACE_DIR is the directory where you put the Mooncake traces (conversation_trace.jsonl and
# synthetic_trace.jsonl from https://github.com/kvcache-ai/Mooncake, folder FAST25-release/traces); without
# it only the generators run. OUT_DIR (default bench-results) receives one JSON file and one plot folder per
# workload and the tables as text. BUILD_DIR (default build-bench) is the CMake build directory used.
set -euo pipefail

TRACE_DIR="${1:-}"
OUT_DIR="${2:-bench-results}"
BUILD_DIR="${BUILD_DIR:-build-bench}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" --target kvroute-bench
BENCH="$BUILD_DIR/bin/kvroute-bench"
mkdir -p "$OUT_DIR"

run() {  # run NAME ARGS...: three loads around the knee, every policy, JSON + plots + table
  local name="$1"; shift
  echo "== $name" >&2
  "$BENCH" simulate "$@" --knee 5 --workers 8 --model qwen3-8b --gpu h100-80gb --seed 1 \
    --json "$OUT_DIR/$name.json" --plots "$OUT_DIR/$name" | tee "$OUT_DIR/$name.txt"
}

if [[ -n "$TRACE_DIR" ]]; then
  for trace in conversation_trace synthetic_trace; do
    if [[ ! -f "$TRACE_DIR/$trace.jsonl" ]]; then
      echo "missing $TRACE_DIR/$trace.jsonl (get it from kvcache-ai/Mooncake, FAST25-release/traces)" >&2
      exit 1
    fi
    run "$trace" --trace "$TRACE_DIR/$trace.jsonl"
  done
  # Performance: the whole conversation trace, all ten policies, at the trace's own pace.
  echo "== timing: conversation_trace, all policies, rate scale 1" >&2
  /usr/bin/time -f "%e s wall, %U s user, %M KiB max RSS" "$BENCH" simulate \
    --trace "$TRACE_DIR/conversation_trace.jsonl" --no-progress > "$OUT_DIR/conversation_trace_timing.txt"
fi

for workload in shared_prefix multi_turn tenants zipf_tools; do
  run "$workload" --workload "$workload"
done
echo "results in $OUT_DIR" >&2
