#!/usr/bin/env bash
# Installs everything kvroute needs to build, test and run its demo on Debian 12, then configures and builds.
# Idempotent: packages already present are skipped by apt, and the build is incremental.
#   usage: scripts/setup.sh [BUILD_DIR]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}

packages=(build-essential cmake ninja-build ccache pkg-config git curl ca-certificates
  libboost1.81-dev libboost-json1.81-dev libprotobuf-dev protobuf-compiler prometheus-cpp-dev libxxhash-dev
  libgtest-dev libgmock-dev libbenchmark-dev libzmq3-dev cppzmq-dev libyaml-cpp-dev libssl-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js may come from another source than Debian's packages (whose npm would conflict with it): only a
# machine without node and npm gets Debian's.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The end-to-end tests drive kvroute with the official openai npm client.
if [ ! -d tests/e2e/node_modules/openai ]; then
  (cd tests/e2e && npm ci --no-audit --no-fund --loglevel=error)
fi

# ccache hits across clones in different folders (paths are made relative to the checkout).
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build_dir" -j"$(nproc)"
