#!/usr/bin/env bash
# Sets up (scripts/setup.sh), builds and runs every test with ctest.
#   usage: scripts/test.sh [ctest arguments...]     e.g. scripts/test.sh -L e2e
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
cd build
ctest --output-on-failure -j2 "$@"
