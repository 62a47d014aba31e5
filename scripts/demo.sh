#!/usr/bin/env bash
# kvroute in one minute: the README's first command.
#
# Sets up and builds (scripts/setup.sh), starts four simulated GPU workers (kvroute-sim: Qwen3-8B on H100,
# running faster than real time) and kvroute in front of them, then replays the same multi-tenant workload
# (40 tenants, each with a long system prompt in its own cache namespace, and users who come back with their
# own growing context) twice: through round_robin, and through kvroute's kv_cost policy, with the workers'
# prefix caches emptied in between. Each request prints one line: its tenant/user, where it went, how many
# of its prompt tokens that worker already had cached, its time to first token. A side-by-side summary ends
# the run. All times are model seconds (what the simulated GPUs would show in real time).
#
#   usage: scripts/demo.sh [BUILD_DIR]        (default build; KVROUTE_DEMO_SKIP_SETUP=1 skips setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}

workers=4
speed=2               # the simulated GPUs run 2x faster than real time (much higher and the host's jitter shows)
workload=tenants
requests=200
request_rate=25       # requests per model second: busy enough that placement shows in TTFT
seed=7

if [ "${KVROUTE_DEMO_SKIP_SETUP:-0}" != 1 ]; then
  echo "== setup: installing packages and building into $build_dir/ (scripts/setup.sh)"
  scripts/setup.sh "$build_dir"
fi
bin=$build_dir/bin
for b in kvroute kvroute-sim kvroute-bench; do
  [ -x "$bin/$b" ] || { echo "demo: $bin/$b is missing; run scripts/setup.sh" >&2; exit 1; }
done

logs=$(mktemp -d "${TMPDIR:-/tmp}/kvroute-demo.XXXXXX")
sim_pid="" router_pid=""
cleanup() {
  for p in $router_pid $sim_pid; do kill "$p" 2>/dev/null || true; done
  for p in $router_pid $sim_pid; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A free block of `n` consecutive ports on 127.0.0.1 (nothing answers a connect on any of them), below the
# kernel's ephemeral range so that no outgoing connection holds one of them.
free_ports() {
  local n=$1 base p ok top
  top=$(awk '{ print $1 }' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
  ((top > 12000)) || top=32768
  for _ in $(seq 1 50); do
    base=$((10000 + RANDOM % (top - 10000 - n)))
    ok=1
    for ((p = base; p < base + n; p++)); do
      if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then ok=0; break; fi
    done
    if [ "$ok" = 1 ]; then echo "$base"; return 0; fi
  done
  echo "demo: no free ports found" >&2
  return 1
}

wait_http() {  # pid port path seconds
  local deadline=$((SECONDS + $4))
  until curl -sf -o /dev/null "http://127.0.0.1:$2$3"; do
    if ! kill -0 "$1" 2>/dev/null || ((SECONDS >= deadline)); then
      echo "demo: 127.0.0.1:$2$3 did not come up; logs in $logs" >&2
      return 1
    fi
    sleep 0.1
  done
}

sim_port=$(free_ports "$workers")
api_port=$(free_ports 2)
admin_port=$((api_port + 1))

echo "== 1/4  $workers simulated workers (kvroute-sim: Qwen3-8B on H100, x$speed real time) on 127.0.0.1:$sim_port-$((sim_port + workers - 1))"
"$bin/kvroute-sim" --port "$sim_port" --workers "$workers" --speed "$speed" >"$logs/kvroute-sim.log" 2>&1 &
sim_pid=$!
for ((i = 0; i < workers; i++)); do wait_http "$sim_pid" $((sim_port + i)) /health 20; done

worker_args=()
for ((i = 0; i < workers; i++)); do worker_args+=(--worker "http://127.0.0.1:$((sim_port + i))"); done

# kvroute has no notion of the workers' --speed: its time-valued settings are given in wall seconds, the
# simulation's defaults divided by the speed (metrics every 0.5 model s, session TTL 600 s, margin 0.25 s).
awk_div() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%g", a / b }'; }
router_args=(--listen "127.0.0.1:$api_port" --admin-listen "127.0.0.1:$admin_port"
  --metrics-interval "$(awk_div 0.5 $speed)" --session-ttl "$(awk_div 600 $speed)"
  --session-margin "$(awk_div 0.25 $speed)" "${worker_args[@]}")

start_router() {  # policy
  "$bin/kvroute" --policy "$1" "${router_args[@]}" >"$logs/kvroute-$1.log" 2>&1 &
  router_pid=$!
  wait_http "$router_pid" "$api_port" /ready 20
}
stop_router() {
  kill "$router_pid" 2>/dev/null || true
  wait "$router_pid" 2>/dev/null || true
  router_pid=""
}

save_metrics() {  # policy
  curl -sf "http://127.0.0.1:$admin_port/metrics" >"$logs/metrics-$1.txt" || true
}

replay() {  # policy
  "$bin/kvroute-bench" replay --target "http://127.0.0.1:$api_port" --workload "$workload" --seed "$seed" \
    --max-requests "$requests" --speed "$speed" --request-rate "$request_rate" --label "$1" \
    --json "$logs/replay-$1.json" --verbose --no-progress 2>"$logs/replay-$1.err" | tee "$logs/replay-$1.out" |
    awk '/^req / { print "   " $0; fflush() }'
}

echo "== 2/4  kvroute --policy round_robin on 127.0.0.1:$api_port; replaying $requests requests of '$workload' ($request_rate/s)"
start_router round_robin
replay round_robin
save_metrics round_robin
stop_router

for ((i = 0; i < workers; i++)); do  # both policies start from cold caches
  curl -sf -o /dev/null -X POST "http://127.0.0.1:$((sim_port + i))/reset_prefix_cache"
done
echo "== 3/4  kvroute --policy kv_cost (restarted; same workers, caches emptied); replaying the same $requests requests"
start_router kv_cost
replay kv_cost
save_metrics kv_cost
stop_router

# Reads one number from a replay's JSON report (boost.json may write exponents: awk reads them).
field() { grep -o "\"$2\":[^,}]*" "$logs/replay-$1.json" | head -1 | cut -d: -f2; }

echo "== 4/4  result: '$workload', $requests requests, $workers workers (times in model seconds)"
# The router's own measure: the cached tokens the workers reported over those one cache of the fleet's whole
# KV capacity would have served on the same requests (kvroute_fleet_cache_hit_tokens_total).
efficiency() {
  awk '/^kvroute_fleet_cache_hit_tokens_total\{cache="workers"\}/ { w = $2 }
       /^kvroute_fleet_cache_hit_tokens_total\{cache="shared"\}/ { s = $2 }
       END { if (s > 0) printf "%.0f%%", 100 * w / s; else printf "-" }' "$logs/metrics-$1.txt" 2>/dev/null || printf -- "-"
}
printf '   %-12s %9s %11s %11s %11s %7s %7s\n' policy "hit rate" "vs shared" "TTFT mean" "TTFT p99" done errors
for p in round_robin kv_cost; do
  awk -v p="$p" -v h="$(field $p hit_rate)" -v x="$(efficiency $p)" -v m="$(field $p ttft_mean_s)" \
    -v q="$(field $p ttft_p99_s)" -v d="$(field $p completed)" -v e="$(field $p errors)" \
    'BEGIN { printf "   %-12s %8.1f%% %11s %9.3f s %9.3f s %7d %7d\n", p, 100 * h, x, m, q, d, e }'
done
echo "   vs shared: the hit rate against what one cache holding all the workers' KV capacity would reach"
echo "   on the same requests (the router's kvroute_fleet_cache_hit_tokens_total)"
awk -v a="$(field round_robin ttft_mean_s)" -v b="$(field kv_cost ttft_mean_s)" \
  -v c="$(field round_robin ttft_p99_s)" -v d="$(field kv_cost ttft_p99_s)" \
  'BEGIN { if (b > 0 && d > 0) printf "   kv_cost: %.1fx lower mean TTFT, %.1fx lower p99 than round_robin\n", a / b, c / d }'
echo "   logs and JSON reports: $logs"
