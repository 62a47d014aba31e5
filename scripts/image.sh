#!/usr/bin/env bash
# Builds kvroute's container image (the top-level Dockerfile) and smoke-tests it by serving the demo: one
# kvroute router in front of two simulated workers (kvroute-sim), both from the image.
#
#   scripts/image.sh                 build, then smoke-test (the default)
#   scripts/image.sh build           build only
#   scripts/image.sh smoke           smoke-test an image already built
#   scripts/image.sh check-libs      no container engine needed: check that the runtime stage's packages
#                                    provide every shared library the built binaries load (ldd + dpkg + apt)
#
# The smoke test starts the workers' container (publishing the router's ports on loopback), runs the router
# in the same network namespace, and checks: the router becomes ready with two healthy workers; a chat
# completion is answered 200 by a worker named in x-kvroute-worker; the same long prompt sent again reports
# cached tokens (the prefix cache of the worker it was routed to); /metrics counts both requests; the image
# runs as uid 65532 (the chart's runAsUser).
#
# Environment:
#   ENGINE           docker or podman (default: the first of them that answers `info`)
#   IMAGE            image name (default kvroute:<appVersion of helm/kvroute/Chart.yaml>, the chart's default)
#   KVROUTE_BIN_DIR  check-libs: directory with the built kvroute and kvroute-sim (default build/bin)
#   API_PORT         smoke: loopback port for the router's API (default 18080; admin is API_PORT+1)
# Exit status: 0 passed, 1 failed, 2 usage or no container engine, 77 check-libs without apt package lists.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
APP_VERSION="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$ROOT/helm/kvroute/Chart.yaml")"
IMAGE="${IMAGE:-kvroute:$APP_VERSION}"
API_PORT="${API_PORT:-18080}"
ADMIN_PORT=$((API_PORT + 1))

die() { echo "image.sh: $*" >&2; exit 1; }

pick_engine() {
  if [[ -n "${ENGINE:-}" ]]; then echo "$ENGINE"; return 0; fi
  for e in docker podman; do
    if command -v "$e" >/dev/null 2>&1 && "$e" info >/dev/null 2>&1; then echo "$e"; return 0; fi
  done
  echo "image.sh: no working container engine (docker or podman); 'check-libs' runs without one" >&2
  exit 2
}

build() {
  local engine; engine="$(pick_engine)"
  echo "== building $IMAGE with $engine"
  "$engine" build -t "$IMAGE" "$ROOT"
}

# The packages the Dockerfile's runtime stage installs, read from the Dockerfile itself (one source of truth).
runtime_packages() {
  awk '/^FROM .* AS runtime/ {rt=1} rt && /install -y/ {on=1} on {print} on && !/\\$/ {on=0}' "$ROOT/Dockerfile" |
    tr ' \\' '\n\n' | grep -E '^lib[a-z0-9.+-]+$' | sort -u
}

# OWNERS: `dpkg -S` over every library both binaries load, in one call (each call reads the whole file
# database); a path is tried as given, resolved, and with or without /usr (merged /usr).
load_owners() {
  local paths=() cand
  while read -r cand; do
    paths+=("$cand" "$(readlink -f "$cand")" "/usr$cand" "${cand#/usr}")
  done < <(ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u)
  OWNERS="$(dpkg -S "${paths[@]}" 2>/dev/null || true)"
}
lib_owner() {  # lib_owner PATH: its package, from OWNERS
  local cand
  for cand in "$1" "$(readlink -f "$1")" "/usr$1" "${1#/usr}"; do
    awk -F': ' -v p="$cand" '$2 == p {split($1, a, ":"); print a[1]; exit}' <<<"$OWNERS" | grep . && return 0
  done
  return 0
}

check_libs() {
  local bin_dir="${KVROUTE_BIN_DIR:-$ROOT/build/bin}" pkgs closure missing=0 b lib path owner used=""
  pkgs="$(runtime_packages)"
  [[ -n "$pkgs" ]] || die "no runtime packages found in the Dockerfile"
  command -v apt-cache >/dev/null && command -v dpkg >/dev/null || die "check-libs needs Debian's apt-cache and dpkg"
  # Everything `apt-get install --no-install-recommends PKGS` brings into a fresh Debian 12: the packages and
  # their dependencies, recursively.
  # shellcheck disable=SC2086
  closure="$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
    --no-enhances $pkgs 2>/dev/null | grep -E '^[a-z0-9]' | sort -u)"
  if [[ -z "$closure" ]]; then  # no package lists on this machine: nothing to check against
    echo "SKIP: apt knows none of the runtime packages (run apt-get update)"; exit 77
  fi
  for p in $pkgs; do
    grep -qx "$p" <<<"$closure" || die "runtime package $p is unknown to apt (misspelled in the Dockerfile?)"
  done
  echo "runtime packages: $(echo $pkgs)"
  LIB_BINS=()
  for b in kvroute kvroute-sim; do
    [[ -x "$bin_dir/$b" ]] || die "$bin_dir/$b not found (build it, or set KVROUTE_BIN_DIR)"
    LIB_BINS+=("$bin_dir/$b")
  done
  load_owners "${LIB_BINS[@]}"
  for b in kvroute kvroute-sim; do
    if ldd "$bin_dir/$b" | grep -q 'not found'; then
      ldd "$bin_dir/$b" | grep 'not found' >&2; die "$b has unresolved libraries on this machine"
    fi
    while read -r lib path; do
      owner="$(lib_owner "$path")"
      if [[ -z "$owner" ]]; then
        echo "FAIL  $b needs $lib ($path), which no Debian package owns" >&2; missing=1
      elif grep -qx "$owner" <<<"$closure"; then
        echo "ok    $b: $lib from $owner"; used+="$owner"$'\n'
      else
        echo "FAIL  $b needs $lib from $owner, which the runtime stage does not install" >&2; missing=1
      fi
    done < <(ldd "$bin_dir/$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3} $1 ~ /^\// {print $1, $1}')
  done
  # Only runtime libraries: every package the stage names must provide a library one of the binaries loads.
  for p in $pkgs; do
    grep -qx "$p" <<<"$used" || { echo "FAIL  the runtime stage installs $p, which neither binary loads" >&2; missing=1; }
  done
  [[ $missing -eq 0 ]] || die "the runtime stage's package list is wrong (see FAIL lines; Dockerfile, stage runtime)"
  echo "every shared library of kvroute and kvroute-sim comes with the runtime stage's packages, and each of them is used"
}

smoke() {
  local engine sim router log prompt body headers worker cached
  engine="$(pick_engine)"
  sim="kvroute-smoke-sim-$$"; router="kvroute-smoke-router-$$"
  log="$(mktemp -d)"
  trap '"$engine" rm -f "$router" "$sim" >/dev/null 2>&1 || true; rm -rf "$log"' EXIT
  [[ "$("$engine" run --rm --entrypoint id "$IMAGE" -u)" == 65532 ]] || die "the image does not run as uid 65532"
  echo "ok    runs as uid 65532"
  # The workers' container owns the network namespace (and publishes the router's ports); the router joins it.
  "$engine" run -d --name "$sim" -p "127.0.0.1:$API_PORT:8080" -p "127.0.0.1:$ADMIN_PORT:9090" \
    --entrypoint /usr/local/bin/kvroute-sim "$IMAGE" --host 127.0.0.1 --port 8001 --workers 2 --speed 20 >/dev/null
  "$engine" run -d --name "$router" --network "container:$sim" "$IMAGE" \
    --listen 0.0.0.0:8080 --admin-listen 0.0.0.0:9090 --health-interval 0.5 \
    --worker http://127.0.0.1:8001 --worker http://127.0.0.1:8002 >/dev/null
  for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$API_PORT/ready" >/dev/null 2>&1 && break
    sleep 0.2
  done
  if ! curl -fsS "http://127.0.0.1:$API_PORT/ready" >/dev/null; then
    "$engine" logs "$sim" >&2 || true; "$engine" logs "$router" >&2 || true
    die "the router did not become ready"
  fi
  echo "ok    router ready in front of two simulated workers"
  prompt="$(printf 'You are the support assistant of a company that sells routers. %.0s' $(seq 1 20))"
  body="{\"model\":\"qwen3-8b\",\"max_tokens\":4,\"messages\":[{\"role\":\"system\",\"content\":\"$prompt\"},{\"role\":\"user\",\"content\":\"hello\"}]}"
  for i in 1 2; do
    curl -fsS -D "$log/h$i" -o "$log/b$i" "http://127.0.0.1:$API_PORT/v1/chat/completions" \
      -H 'content-type: application/json' -d "$body" || die "chat completion $i failed"
  done
  worker="$(grep -i '^x-kvroute-worker:' "$log/h1" | tr -d '\r' | cut -d' ' -f2)"
  [[ -n "$worker" ]] || die "no x-kvroute-worker header on the response"
  echo "ok    chat completion answered by worker $worker"
  cached="$(grep -o '"cached_tokens":[0-9]*' "$log/b2" | head -n1 | cut -d: -f2)"
  [[ "${cached:-0}" -gt 0 ]] || die "the repeated prompt reported no cached tokens: $(head -c 300 "$log/b2")"
  echo "ok    repeated prompt: $cached cached tokens"
  curl -fsS "http://127.0.0.1:$ADMIN_PORT/metrics" | grep -q '^kvroute_requests_total' ||
    die "/metrics has no kvroute_requests_total"
  echo "ok    /metrics on the admin port"
  echo "image $IMAGE serves the demo"
}

case "${1:-all}" in
  all) build; smoke ;;
  build) build ;;
  smoke) smoke ;;
  check-libs) check_libs ;;
  -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) echo "usage: scripts/image.sh [all|build|smoke|check-libs]" >&2; exit 2 ;;
esac
