#!/bin/sh
# Configures and builds modeld, modelctl and the tests into build/ (ccache and Ninja when present).
set -eu
cd "$(dirname "$0")/.."
export CCACHE_NOHASHDIR=1
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C build -j"$(nproc)"
