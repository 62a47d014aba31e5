#!/usr/bin/env bash
# Proxy overhead: requests per second and latency of kvroute against nginx relaying the same traffic to the
# same simulated workers, plus the workers reached directly as the ceiling. Reproduces docs/overhead.md.
#
#   scripts/bench-proxy.sh                      # BUILD_DIR=build, 3 rounds of 5 s per configuration
#   BUILD_DIR=build-perf ROUNDS=5 DURATION=10 scripts/bench-proxy.sh
#
# Builds nothing: expects $BUILD_DIR/bin/kvroute and $BUILD_DIR/bin/kvroute-sim (a Release build for
# numbers worth quoting). Installs nginx-light and wrk with apt-get when they are missing. Everything
# listens on 127.0.0.1 on free ports and is stopped on exit.
#
# Configurations: direct (wrk -> one kvroute-sim worker), nginx (upstream of every worker, keep-alive,
# HTTP/1.1, proxy_buffering off), kvroute --policy round_robin (prefix-blind, as nginx), kvroute --policy
# kv_cost (the default). nginx gets as many worker processes as kvroute gets I/O threads. Each one runs a
# non-streaming and a streaming request mix; configurations are interleaved round by round, so that noise
# from other work on the machine spreads over all of them, and the table shows the median of the rounds.
#
# Knobs (environment): BUILD_DIR, WORKERS (4), THREADS (2: kvroute --threads and nginx worker_processes),
# CONNECTIONS (64), WRK_THREADS (2), DURATION (seconds, 5), ROUNDS (3), SPEED (kvroute-sim --speed, 1000),
# MAX_TOKENS (8), PROMPTS (64 distinct prompts sharing a system prompt), CONFIGS ("direct nginx kv_rr
# kv_cost"), MODES ("json sse"). KVROUTE_BASE=PATH adds configuration base_rr: another kvroute binary (say,
# a build of the previous commit) with --policy round_robin, for before/after comparisons in the same run.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
BUILD_DIR="${BUILD_DIR:-build}"
WORKERS="${WORKERS:-4}"
THREADS="${THREADS:-2}"
CONNECTIONS="${CONNECTIONS:-64}"
WRK_THREADS="${WRK_THREADS:-2}"
DURATION="${DURATION:-5}"
ROUNDS="${ROUNDS:-3}"
SPEED="${SPEED:-1000}"
MAX_TOKENS="${MAX_TOKENS:-8}"
PROMPTS="${PROMPTS:-64}"
KVROUTE_BASE="${KVROUTE_BASE:-}"
CONFIGS="${CONFIGS:-direct nginx kv_rr kv_cost${KVROUTE_BASE:+ base_rr}}"
MODES="${MODES:-json sse}"

KVROUTE="$BUILD_DIR/bin/kvroute"
SIM="$BUILD_DIR/bin/kvroute-sim"
for bin in "$KVROUTE" "$SIM"; do
  [[ -x "$bin" ]] || { echo "missing $bin: build it first (cmake --build $BUILD_DIR --target kvroute kvroute-sim)" >&2; exit 1; }
done

NGINX="$(command -v nginx || true)"
[[ -z "$NGINX" && -x /usr/sbin/nginx ]] && NGINX=/usr/sbin/nginx
if [[ -z "$NGINX" ]] || ! command -v wrk >/dev/null; then
  echo "installing nginx-light and wrk" >&2
  SUDO=""; [[ "$(id -u)" -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq >/dev/null
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light wrk >/dev/null
  NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
fi

TMP="$(mktemp -d -t kvroute-bench-proxy.XXXXXX)"
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- free ports -------------------------------------------------------------------------------------------
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# Listen ports come from below the kernel's ephemeral range: ports of that range are taken by client-side
# connections (wrk's, the proxies' upstream ones, and those of a previous run still closing), which the probe
# below cannot see, and a server that picks one cannot bind it (two runs in a row failed so).
EPHEMERAL_LOW="$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)"
((EPHEMERAL_LOW > 12000)) || EPHEMERAL_LOW=32768
NEXT_PORT=$((10000 + RANDOM % (EPHEMERAL_LOW - 11000)))
free_port() {  # free_port COUNT: sets PORT to the first of COUNT consecutive free ports
  local count="$1" p ok i
  for ((p = NEXT_PORT; p < 65000; p += count)); do
    ok=1
    for ((i = 0; i < count; i++)); do
      if port_busy $((p + i)); then ok=0; break; fi
    done
    if ((ok)); then NEXT_PORT=$((p + count)); PORT="$p"; return; fi
  done
  echo "no free port" >&2; exit 1
}
wait_http() {  # wait_http URL: until it answers 200 (10 s)
  local i
  for ((i = 0; i < 100; i++)); do
    if curl -sf -o /dev/null "$1"; then return 0; fi
    sleep 0.1
  done
  echo "$1 did not come up" >&2; exit 1
}

# ---- workers: one kvroute-sim process each, so that the backend is not one thread for all --------------
free_port "$WORKERS"; SIM_BASE="$PORT"
WORKER_ARGS=() UPSTREAMS=""
for ((i = 0; i < WORKERS; i++)); do
  port=$((SIM_BASE + i))
  "$SIM" --host 127.0.0.1 --port "$port" --workers 1 --speed "$SPEED" --seed "$i" >"$TMP/sim$i.log" 2>&1 &
  PIDS+=($!)
  WORKER_ARGS+=(--worker "http://127.0.0.1:$port")
  UPSTREAMS+="    server 127.0.0.1:$port;"$'\n'
done
for ((i = 0; i < WORKERS; i++)); do wait_http "http://127.0.0.1:$((SIM_BASE + i))/health"; done

# ---- nginx ------------------------------------------------------------------------------------------------
free_port 1; NGINX_PORT="$PORT"
mkdir -p "$TMP/nginx"
NGINX_USER=""; [[ "$(id -u)" -eq 0 ]] && NGINX_USER="user root;"
cat >"$TMP/nginx/nginx.conf" <<EOF
$NGINX_USER
worker_processes $THREADS;
daemon off;
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $TMP/nginx/body;
  proxy_temp_path $TMP/nginx/proxy;
  fastcgi_temp_path $TMP/nginx/fastcgi;
  uwsgi_temp_path $TMP/nginx/uwsgi;
  scgi_temp_path $TMP/nginx/scgi;
  keepalive_requests 1000000;
  upstream workers {
$UPSTREAMS    keepalive 128;
    keepalive_requests 1000000;
  }
  server {
    listen 127.0.0.1:$NGINX_PORT;
    location / {
      proxy_pass http://workers;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
EOF
"$NGINX" -c "$TMP/nginx/nginx.conf" -e "$TMP/nginx/error.log" >"$TMP/nginx/stdout.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$NGINX_PORT/health"

# ---- kvroute, once per policy -----------------------------------------------------------------------------
start_kvroute() {  # start_kvroute POLICY [BINARY]: sets PORT to its API port
  local policy="$1" bin="${2:-$KVROUTE}" admin
  free_port 1; admin="$PORT"
  free_port 1
  "$bin" --listen "127.0.0.1:$PORT" --admin-listen "127.0.0.1:$admin" --policy "$policy" --threads "$THREADS" \
    --log-level warn "${WORKER_ARGS[@]}" >"$TMP/kvroute-$policy-$PORT.log" 2>&1 &
  PIDS+=($!)
}
start_kvroute round_robin; KV_RR_PORT="$PORT"
start_kvroute kv_cost; KV_COST_PORT="$PORT"
wait_http "http://127.0.0.1:$KV_RR_PORT/ready"
wait_http "http://127.0.0.1:$KV_COST_PORT/ready"
if [[ -n "$KVROUTE_BASE" ]]; then
  start_kvroute round_robin "$KVROUTE_BASE"; BASE_RR_PORT="$PORT"
  wait_http "http://127.0.0.1:$BASE_RR_PORT/ready"
fi

target() {
  case "$1" in
    direct) echo "http://127.0.0.1:$SIM_BASE" ;;
    nginx) echo "http://127.0.0.1:$NGINX_PORT" ;;
    kv_rr) echo "http://127.0.0.1:$KV_RR_PORT" ;;
    kv_cost) echo "http://127.0.0.1:$KV_COST_PORT" ;;
    base_rr) echo "http://127.0.0.1:${BASE_RR_PORT:?KVROUTE_BASE is not set}" ;;
    *) echo "unknown configuration $1" >&2; exit 1 ;;
  esac
}

# ---- wrk script: PROMPTS chat requests that share a system prompt, built once, sent in turn ------------
for mode in json sse; do
  stream=false; [[ "$mode" == sse ]] && stream=true
  cat >"$TMP/$mode.lua" <<EOF
local stream, max_tokens, prompts = $stream, $MAX_TOKENS, $PROMPTS
local system = "You are a concise assistant for a logistics company. Answer in one short sentence."
local reqs, n = {}, 0
function init(args)
  local tid = math.random(1, 1000000)
  for i = 1, prompts do
    local body = string.format('{"model":"qwen3-8b","max_tokens":%d,"stream":%s,"messages":['
      .. '{"role":"system","content":"%s"},{"role":"user","content":"Where is parcel %d of customer %d?"}]}',
      max_tokens, tostring(stream), system, i, (i * 7919) % 1000)
    reqs[i] = wrk.format("POST", "/v1/chat/completions", {["Content-Type"] = "application/json"}, body)
  end
  n = tid % prompts
end
function request()
  n = n % prompts + 1
  return reqs[n]
end
function done(summary, latency, requests)
  local errors = summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout
    + summary.errors.status
  io.write(string.format("RESULT %.1f %.3f %.3f %d %d\n", summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, summary.requests, errors))
end
EOF
done

run_wrk() {  # run_wrk CONFIG MODE SECONDS: prints "rps p50_ms p99_ms requests errors"
  wrk -t "$WRK_THREADS" -c "$CONNECTIONS" -d "${3}s" --timeout 10s -s "$TMP/$2.lua" "$(target "$1")" \
    | awk '/^RESULT/ {print $2, $3, $4, $5, $6}'
}

echo "kvroute bench-proxy: $(nproc) cores, $WORKERS kvroute-sim workers (--speed $SPEED, max_tokens $MAX_TOKENS)," \
  "$THREADS kvroute threads / nginx workers, wrk -t$WRK_THREADS -c$CONNECTIONS, ${DURATION}s x $ROUNDS rounds" >&2
for cfg in $CONFIGS; do for mode in $MODES; do run_wrk "$cfg" "$mode" 1 >/dev/null; done; done  # warm-up

RESULTS="$TMP/results"
: >"$RESULTS"
for ((round = 1; round <= ROUNDS; round++)); do
  for mode in $MODES; do
    for cfg in $CONFIGS; do
      line="$(run_wrk "$cfg" "$mode" "$DURATION")"
      [[ -n "$line" ]] || { echo "wrk gave no result for $cfg/$mode" >&2; continue; }
      echo "$round $mode $cfg $line" >>"$RESULTS"
      echo "  round $round  $mode  $cfg: $line (req/s p50_ms p99_ms requests errors)" >&2
    done
  done
done

# ---- table: median of the rounds; ratio of each kvroute row to nginx in the same mode ----------------------
median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
printf '\n%-5s %-8s %10s %9s %9s %8s %12s %s\n' mode config "req/s" "p50 ms" "p99 ms" errors "vs nginx" "req/s of each round"
for mode in $MODES; do
  nginx_rps="$(awk -v m="$mode" '$2 == m && $3 == "nginx" {print $4}' "$RESULTS" | median)"
  for cfg in $CONFIGS; do
    rows="$(awk -v m="$mode" -v c="$cfg" '$2 == m && $3 == c' "$RESULTS")"
    [[ -n "$rows" ]] || continue
    rps="$(awk '{print $4}' <<<"$rows" | median)"
    p50="$(awk '{print $5}' <<<"$rows" | median)"
    p99="$(awk '{print $6}' <<<"$rows" | median)"
    errs="$(awk '{s += $8} END {print s}' <<<"$rows")"
    each="$(awk '{printf "%s%.0f", (NR > 1 ? " " : ""), $4}' <<<"$rows")"
    ratio="$(awk -v a="$rps" -v b="$nginx_rps" 'BEGIN {if (b > 0 && b != "nan") printf "%.2fx", a / b; else print "-"}')"
    printf '%-5s %-8s %10.0f %9.2f %9.2f %8d %12s %s\n' "$mode" "$cfg" "$rps" "$p50" "$p99" "$errs" "$ratio" "$each"
  done
done
