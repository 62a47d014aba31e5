#!/usr/bin/env bash
# Runs the test suite under the sanitizers, in build folders of their own:
#   asan  every test, built with AddressSanitizer and UndefinedBehaviorSanitizer (KVROUTE_SANITIZE)
#   tsan  the concurrency tests, built with ThreadSanitizer (KVROUTE_TSAN): the prefix index under concurrent
#         readers and writers, the worker registry, the KV event subscribers, the shared-state client, and the
#         daemon under parallel clients (router_e2e_test spawns the TSan-built kvroute and kvroute-sim), and its
#         failover (failover_e2e_test: retries, ejections and health checks from every I/O thread), and its
#         warm-ups (warm_up_e2e_test: a second POST whose end reaches the router from another thread), and two
#         replicas in one process sharing a real Redis (router_shared_state_test)
# A sanitizer report fails the test: the processes stop at the first one (halt_on_error / abort_on_error).
#   usage: scripts/sanitize.sh [asan|tsan|all] [ctest arguments...]   (default all)
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
shift || true
scripts/setup.sh build >/dev/null  # packages (and the plain build, whose objects are not shared with these)
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
jobs=${JOBS:-$(nproc)}

if [ "$what" = asan ] || [ "$what" = all ]; then
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVROUTE_SANITIZE=ON >/dev/null
  cmake --build build-asan -j"$jobs"
  (cd build-asan &&
    ASAN_OPTIONS=abort_on_error=1:detect_leaks=1:strict_string_checks=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --output-on-failure -j"$jobs" "$@")
fi

if [ "$what" = tsan ] || [ "$what" = all ]; then
  tests=(hashing_test backends_test events_test shared_state_test router_e2e_test failover_e2e_test warm_up_e2e_test
         router_shared_state_test)
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVROUTE_TSAN=ON -DKVROUTE_BUILD_BENCH=OFF \
    -DKVROUTE_TEST_DIRS="hashing;backends;events;e2e;router" >/dev/null
  cmake --build build-tsan -j"$jobs" --target kvroute kvroute-sim "${tests[@]}"
  pattern=$(IFS='|'; echo "^(${tests[*]})\$")
  (cd build-tsan &&
    TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/../scripts/tsan.supp" \
    ctest --output-on-failure -j1 -R "$pattern" "$@")
fi
