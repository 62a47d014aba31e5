#!/usr/bin/env bash
# Builds kvroute's libFuzzer targets with clang (Debian's clang-16, libfuzzer-16-dev, libclang-rt-16-dev) and
# runs each for a while, starting from the seed corpus in tests/fuzz/corpus. New inputs go to a scratch corpus;
# crashes are written to OUT_DIR/TARGET/crash-* (add each, with its fix, to tests/fuzz/corpus/TARGET/).
#   usage: scripts/fuzz.sh [SECONDS_PER_TARGET (default 600)] [TARGET ...]   (env OUT_DIR, default out/fuzz)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(request usage vllm_events native_events metrics config hygiene)
out=${OUT_DIR:-out/fuzz}

for p in clang-16 libfuzzer-16-dev libclang-rt-16-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ -n "${missing:-}" ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
CC=clang-16 CXX=clang++-16 cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVROUTE_FUZZ=ON \
  -DKVROUTE_BUILD_BENCH=OFF -DKVROUTE_TEST_DIRS=fuzz >/dev/null
cmake --build build-fuzz -j"${JOBS:-2}" --target "${targets[@]/#/fuzz_}"

for t in "${targets[@]}"; do
  mkdir -p "$out/$t/corpus"
  cp -n tests/fuzz/corpus/"$t"/* "$out/$t/corpus/" 2>/dev/null || true
  echo "== $t: ${seconds}s"
  # -rss_limit_mb and -timeout: a leak or a hang is a finding too.
  build-fuzz/fuzz/fuzz_"$t" "$out/$t/corpus" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
    -max_len=65536 -artifact_prefix="$out/$t/" -print_final_stats=1 >"$out/$t/last_run.txt" 2>&1 ||
    echo "fuzz_$t stopped on a finding: see $out/$t/last_run.txt"
  tail -n 12 "$out/$t/last_run.txt"
done
