#!/bin/sh
# Installs the dependencies, builds, and runs every test: the unit tests of each stage and the
# integration tests (fixtures, real systemd in a private namespace, end-to-end deployments).
# Run as root on Debian 12. Extra arguments go to ctest (e.g. -L unit, -R e2e).
set -eu
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
cd build
ctest --output-on-failure --timeout 900 "$@"
