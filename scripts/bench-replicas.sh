#!/usr/bin/env bash
# Reproduces the router-replica table of docs/benchmarks.md ("Router replicas"): kv_cost simulated with 1, 2, 4
# and 8 router replicas (arrivals round-robin over them), each sharing nothing or what --shared-state shares
# through Redis, in approximate and in precise mode, on the two Mooncake traces and the four built-in
# generators, each at its knee rate scale (docs/benchmarks.md, "Results"). Writes one JSON file per cell into
# OUT_DIR and the markdown table to OUT_DIR/replicas.md (and stdout).
#
#   scripts/bench-replicas.sh TRACE_DIR [OUT_DIR]
#
# TRACE_DIR holds conversation_trace.jsonl and synthetic_trace.jsonl (github.com/kvcache-ai/Mooncake,
# FAST25-release/traces); without it only the generators run. TRACE_REQUESTS (default 3000) takes the first N
# requests of each trace (the whole table then costs about 15 minutes of one core); 0 = the whole traces.
# BUILD_DIR (default build-bench) is the CMake build directory; JOBS (default 1) cells run at once.
# SEEDS (default empty), e.g. "1 2 3 4 5 6 7 8 9 10": the generators also run at 1 replica and at 8 sharing under
# each of these seeds (into OUT_DIR/seeds), and a second table, OUT_DIR/replicas-seeds.md, gives the median and
# range of the ratios over them (a p99 over 6,000 requests moves by several per cent from seed to seed; about 15
# seconds of one core per seed).
# TRACE_LOADS (default empty), e.g. "0.98 0.99 1 1.01 1.02 1.03 1.04": each trace also runs at 1 replica and at 8
# sharing at each of these multiples of its knee rate scale (into OUT_DIR/loads), and OUT_DIR/replicas-loads.md gives
# the ratio of the two medians over them and each one's range. A trace's hit rate moves by several per cent between
# nearby loads, so one pair of runs says little about the ratio (docs/benchmarks.md, "Eight replicas against one
# over nearby loads and seeds").
set -euo pipefail

TRACE_DIR="${1:-}"
OUT_DIR="${2:-bench-results/replicas}"
BUILD_DIR="${BUILD_DIR:-build-bench}"
TRACE_REQUESTS="${TRACE_REQUESTS:-3000}"
JOBS="${JOBS:-1}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

if [[ -z "${BENCH:-}" ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$BUILD_DIR" --target kvroute-bench
  BENCH="$BUILD_DIR/bin/kvroute-bench"
fi
mkdir -p "$OUT_DIR"

# name, source arguments, rate scale (the knee of docs/benchmarks.md's Results for that workload)
cells=()
if [[ -n "$TRACE_DIR" ]]; then
  limit=()
  [[ "$TRACE_REQUESTS" != 0 ]] && limit=(--max-requests "$TRACE_REQUESTS")
  cells+=("conversation_trace|--trace $TRACE_DIR/conversation_trace.jsonl ${limit[*]}|2.57")
  cells+=("synthetic_trace|--trace $TRACE_DIR/synthetic_trace.jsonl ${limit[*]}|2.16")
fi
cells+=("shared_prefix|--workload shared_prefix|0.814" "multi_turn|--workload multi_turn|1.28"
        "tenants|--workload tenants|0.947" "zipf_tools|--workload zipf_tools|0.989")

run_into() {  # out seed source scale mode replicas sharing label: one simulation into `out`, unless it is there
  local out=$1
  [[ -s "$out" ]] && return 0
  # shellcheck disable=SC2086
  nice -n 10 "$BENCH" simulate $3 --policies kv_cost --mode "$5" --replicas "$6" --sharing "$7" \
    --rate-scale "$4" --workers 8 --seed "$2" --threads 1 --no-progress --json "$out.tmp" >/dev/null 2>"$out.log"
  mv "$out.tmp" "$out"
  echo "  $8" >&2
}

run_cell() {  # name source scale mode replicas sharing [seed: into OUT_DIR/seeds; default 1, into OUT_DIR]
  local out="$OUT_DIR/$1.$4.r$5.$6.json"
  [[ -n "${7:-}" ]] && out="$OUT_DIR/seeds/$1.$4.r$5.$6.s$7.json"
  run_into "$out" "${7:-1}" "$2" "$3" "$4" "$5" "$6" "$1 $4 x$5 $6${7:+ seed $7}"
}

pids=()
spawn() {  # runs "$@" in the background, at most JOBS at once
  "$@" &
  pids+=($!)
  if ((${#pids[@]} >= JOBS)); then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
}
drain() {  # waits for every spawned run
  for p in "${pids[@]}"; do wait "$p"; done
  pids=()
}

for cell in "${cells[@]}"; do
  IFS='|' read -r name source scale <<<"$cell"
  echo "== $name (rate scale $scale)" >&2
  for mode in approximate precise; do
    for spec in "1 none" "2 none" "2 redis" "4 none" "4 redis" "8 none" "8 redis"; do
      set -- $spec
      spawn run_cell "$name" "$source" "$scale" "$mode" "$1" "$2"
    done
  done
done
drain

python3 - "$OUT_DIR" <<'EOF' | tee "$OUT_DIR/replicas.md"
import json, os, sys
d = sys.argv[1]
cells = {}
for f in sorted(os.listdir(d)):
    if not f.endswith(".json"):
        continue
    name, mode, rep, sharing, _ = f.split(".")
    p = json.load(open(os.path.join(d, f)))["policies"][0]
    cells[(name, mode, int(rep[1:]), sharing)] = p
order = ["conversation_trace", "synthetic_trace", "shared_prefix", "multi_turn", "tenants", "zipf_tools"]
print("| workload | mode | replicas | sharing | hit rate | mean TTFT s | p99 TTFT s | hit / 1 replica | mean / 1 | p99 / 1 |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name in [n for n in order if any(k[0] == n for k in cells)]:
    for mode in ["approximate", "precise"]:
        one = cells.get((name, mode, 1, "none"))
        if not one:
            continue
        for rep in [1, 2, 4, 8]:
            for sharing in (["none"] if rep == 1 else ["none", "redis"]):
                c = cells.get((name, mode, rep, sharing))
                if not c:
                    continue
                ratios = [c[k] / one[k] if one[k] else 0 for k in ("hit_rate", "ttft_mean_s", "ttft_p99_s")]
                cols = ["%.3f" % x for x in ratios]
                if rep == 8 and sharing == "redis":
                    cols = ["**%s**" % x for x in cols]
                print("| %s | %s | %d | %s | %.1f %% | %.3f | %.3f | %s |" % (
                    name, mode, rep, sharing if rep > 1 else "-", 100 * c["hit_rate"], c["ttft_mean_s"],
                    c["ttft_p99_s"], " | ".join(cols)))
EOF

if [[ -n "${TRACE_LOADS:-}" ]]; then
  mkdir -p "$OUT_DIR/loads"
  for cell in "${cells[@]}"; do
    IFS='|' read -r name source scale <<<"$cell"
    [[ "$name" == *_trace ]] || continue
    for load in $TRACE_LOADS; do
      at=$(python3 -c "print(round($scale * $load, 4))")
      for mode in approximate precise; do
        for spec in "1 none" "8 redis"; do
          set -- $spec
          spawn run_into "$OUT_DIR/loads/$name.$mode.r$1.x$load.json" 1 "$source" "$at" "$mode" "$1" "$2" \
            "$name $mode x$1 $2 at $at"
        done
      done
    done
  done
  drain
  python3 - "$OUT_DIR/loads" <<'EOF' | tee "$OUT_DIR/replicas-loads.md"
import json, os, statistics, sys
d = sys.argv[1]
hit = {}
for f in sorted(os.listdir(d)):
    if f.endswith(".json"):
        name, mode, rep = f.split(".")[:3]
        hit.setdefault((name, mode, rep), []).append(json.load(open(os.path.join(d, f)))["policies"][0]["hit_rate"])
print("| trace | mode | loads | hit rate, 1 replica: median (range) | 8 sharing | median of 8 / median of 1 |")
print("|---|---|---|---|---|---|")
for name, mode in sorted({(k[0], k[1]) for k in hit}):
    one, eight = hit.get((name, mode, "r1"), []), hit.get((name, mode, "r8"), [])
    if not one or not eight:
        continue
    cols = ["%.2f %% (%.2f-%.2f)" % (100 * statistics.median(v), 100 * min(v), 100 * max(v)) for v in (one, eight)]
    print("| %s | %s | %d | %s | **%.3f** |" % (name, mode, len(one), " | ".join(cols),
                                              statistics.median(eight) / statistics.median(one)))
EOF
fi

[[ -z "${SEEDS:-}" ]] && exit 0
mkdir -p "$OUT_DIR/seeds"
for seed in $SEEDS; do
  for cell in "${cells[@]}"; do
    IFS='|' read -r name source scale <<<"$cell"
    [[ "$name" == *_trace ]] && continue  # a trace is one fixed run: its seed changes nothing
    for mode in approximate precise; do
      for spec in "1 none" "8 redis"; do
        set -- $spec
        run_cell "$name" "$source" "$scale" "$mode" "$1" "$2" "$seed"
      done
    done
  done
done
python3 - "$OUT_DIR/seeds" $SEEDS <<'EOF' | tee "$OUT_DIR/replicas-seeds.md"
import json, os, statistics, sys
d, seeds = sys.argv[1], {"s" + s for s in sys.argv[2:]}
runs = {}
for f in sorted(os.listdir(d)):
    if f.endswith(".json"):
        name, mode, rep, _, seed, _ = f.split(".")
        if seed in seeds:
            runs[(name, mode, rep, seed)] = json.load(open(os.path.join(d, f)))["policies"][0]
print("| workload | mode | seeds | hit / 1 replica | mean TTFT / 1 | p99 TTFT / 1 |")
print("|---|---|---|---|---|---|")
for name, mode in sorted({(k[0], k[1]) for k in runs}):
    ratios = {k: [] for k in ("hit_rate", "ttft_mean_s", "ttft_p99_s")}
    for (n, m, rep, seed), eight in runs.items():
        one = runs.get((n, m, "r1", seed))
        if (n, m, rep) != (name, mode, "r8") or not one:
            continue
        for k in ratios:
            ratios[k].append(eight[k] / one[k] if one[k] else 0)
    cols = ["%.3f (%.3f-%.3f)" % (statistics.median(v), min(v), max(v)) for v in ratios.values()]
    print("| %s | %s | %d | %s |" % (name, mode, len(ratios["hit_rate"]), " | ".join(cols)))
EOF
