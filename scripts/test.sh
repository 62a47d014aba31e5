#!/usr/bin/env bash
# Sets up (scripts/setup.sh), builds and runs every test with ctest.
#   usage: scripts/test.sh [ctest arguments...]     e.g. scripts/test.sh -L e2e
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
cd build
# The end-to-end tests run real processes on a shared machine; one that fails is run once more, and a test
# fails only if it fails twice (ctest reports both runs).
ctest --output-on-failure -j2 --repeat until-pass:2 "$@"
