#!/usr/bin/env bash
# Chaos soak (docs/reliability.md, "Chaos soak"): load through kvroute for a while (default 10 minutes) while
# simulated workers are killed and restarted every 30 s (cutting the streams they were serving, and their KV
# event streams), a worker answering 503 and one that never answers are added through the admin API, and the
# router's RSS, open fds and CLOSE-WAIT sockets are sampled. Every request's outcome is counted
# (scripts/soak_load.py): completed, failed with a clear error before its first byte, ended its stream with an
# error event, or cut silently (the goal is 0).
#
#   usage: scripts/soak.sh [SECONDS]     (default 600)
#   env:   BUILD_DIR (build), CLIENTS (12), BASE_PORT (31000), OUT (a new folder under /tmp), SPEED (2)
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-600}
bin=${BUILD_DIR:-build}/bin
clients=${CLIENTS:-12}
base=${BASE_PORT:-31000}
speed=${SPEED:-2}
out=${OUT:-$(mktemp -d /tmp/kvroute-soak.XXXXXX)}
mkdir -p "$out"
api=$base admin=$((base + 1))
good=3
declare -a sim_pid port kv
for i in $(seq 0 $((good - 1))); do
  port[$i]=$((base + 10 + i))
  kv[$i]=$((base + 20 + 2 * i))
done
bad503=$((base + 13)) hang=$((base + 14))
pids=()

cleanup() {
  for p in "${pids[@]}" "${sim_pid[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

start_sim() {  # index
  local i=$1
  "$bin/kvroute-sim" --port "${port[$i]}" --speed "$speed" --idle-timeout 5 --kv-events-port "${kv[$i]}" \
    --kv-events-replay-port $((kv[$i] + 1)) >>"$out/sim$i.log" 2>&1 &
  sim_pid[$i]=$!
}
wait_up() {  # port
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0; sleep 0.1; done
  echo "nothing answers on port $1" >&2
  return 1
}
add_worker() {  # port
  curl -sf -X POST "http://127.0.0.1:$admin/admin/workers" -H 'Content-Type: application/json' \
    -d "{\"url\": \"http://127.0.0.1:$1\"}" >/dev/null
}
log() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$out/chaos.log"; }

workers=()
for i in $(seq 0 $((good - 1))); do
  start_sim "$i"
  wait_up "${port[$i]}"
  workers+=(--worker "http://127.0.0.1:${port[$i]},kv_events=tcp://127.0.0.1:${kv[$i]},replay=tcp://127.0.0.1:$((kv[$i] + 1))")
done
"$bin/kvroute" --listen "127.0.0.1:$api" --admin-listen "127.0.0.1:$admin" "${workers[@]}" \
  --first-byte-timeout 2 --request-timeout 60 --access-log true >"$out/access.log" 2>"$out/router.log" &
router=$!
pids+=("$router")
wait_up "$api"
log "router pid $router on :$api, $good workers, $clients clients, ${duration}s; output in $out"

python3 scripts/soak_load.py --target "127.0.0.1:$api" --duration "$duration" --clients "$clients" \
  --router-pid "$router" --out "$out/load.json" >"$out/samples.jsonl" &
load=$!
pids+=("$load")

t0=$(date +%s)
next_kill=30 victim=0 added503=0 addedhang=0
while kill -0 "$load" 2>/dev/null; do
  sleep 1
  t=$(($(date +%s) - t0))
  if ((t >= duration)); then continue; fi
  if ((!added503 && t >= 45)); then
    "$bin/kvroute-sim" --port "$bad503" --fault 503 >"$out/sim503.log" 2>&1 &
    pids+=($!)
    wait_up "$bad503" && add_worker "$bad503" && log "added a worker answering 503 (:$bad503)"
    added503=1
  fi
  if ((!addedhang && t >= 75)); then
    "$bin/kvroute-sim" --port "$hang" --fault hang >"$out/simhang.log" 2>&1 &
    pids+=($!)
    wait_up "$hang" && add_worker "$hang" && log "added a worker that never answers (:$hang)"
    addedhang=1
  fi
  if ((t >= next_kill)); then
    kill -9 "${sim_pid[$victim]}" 2>/dev/null || true
    wait "${sim_pid[$victim]}" 2>/dev/null || true
    log "killed worker $victim (:${port[$victim]}) with its streams under way"
    sleep 3
    start_sim "$victim"
    wait_up "${port[$victim]}" && log "restarted worker $victim"
    victim=$(((victim + 1) % good))
    next_kill=$((next_kill + 30))
  fi
done
wait "$load" || true
curl -sf "http://127.0.0.1:$admin/metrics" >"$out/metrics.txt" || true
curl -sf "http://127.0.0.1:$admin/admin/workers" >"$out/workers.json" || true

python3 - "$out" <<'PY'
import collections, json, re, sys
out = sys.argv[1]
load = json.load(open(f"{out}/load.json"))
print("client outcomes:", json.dumps(load["counts"], sort_keys=True))
outcomes = collections.Counter()
for line in open(f"{out}/access.log"):
    if line.startswith("{"):
        rec = json.loads(line)
        if rec.get("path") == "/v1/chat/completions":
            outcomes[rec.get("outcome")] += 1
print("access log outcomes:", json.dumps(dict(outcomes), sort_keys=True))
s = load["samples"]
if s:
    for key in ("rss_mib", "fds", "close_wait"):
        vals = [x[key] for x in s]
        print(f"{key}: first {vals[0]}, max {max(vals)}, last {vals[-1]}")
print("after the load (settled):", json.dumps(load["final"]))
metrics = open(f"{out}/metrics.txt").read()
for name in ("kvroute_retries_total", "kvroute_retry_budget_exhausted_total", "kvroute_worker_ejections_total",
             "kvroute_streams_cut_total", "kvroute_upstream_connections_reaped_total"):
    for m in re.finditer(r"^" + name + r"(\{[^}]*\})? (\S+)$", metrics, re.M):
        print(f"{name}{m.group(1) or ''} {m.group(2)}")
for e in load["errors"][:10]:
    print("  ", e)
PY
