#!/bin/sh
# Configures and builds into build/ (ccache and Ninja when present): every target, or only the
# targets named as arguments (the demo needs just `modeld modelctl`).
set -eu
cd "$(dirname "$0")/.."
export CCACHE_NOHASHDIR=1
# Paths relative to the checkout in ccache keys, so another clone or worktree hits the same cache.
export CCACHE_BASEDIR="$(pwd)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMODELD_TEST_HOOKS=ON >/dev/null
ninja -C build -j"$(nproc)" "$@"
