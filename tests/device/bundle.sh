#!/bin/sh
# Assembles what the H200 `device` machine needs to run this modeld into build-gpu/ (ignored by
# git: build-*/), under the 64 MiB a `run` call carries:
#   build-gpu/modeld, build-gpu/modelctl     stripped copies of BUILD_DIR's
#   build-gpu/tests/device/gpu_probe         stripped, when BUILD_DIR has it (tests/device/gpu_check.py)
#   build-gpu/lib/                           the shared libraries that machine lacks (Ubuntu 24.04
#                                            there: no Boost, spdlog 1.12 not 1.10, no toml++), by
#                                            their sonames, as `ldd` resolves them here; libfmt too
#
#   tests/device/bundle.sh [BUILD_DIR]      (default build/; built with scripts/build.sh when its
#                                            modeld or modelctl is missing)
#
# Prints the size and the `run` call to use. Needs ldd, strip (binutils) and du.
set -eu
cd "$(dirname "$0")/../.."
build=${1:-build}
out=build-gpu
if [ ! -x "$build/modeld" ] || [ ! -x "$build/modelctl" ]; then
  [ "$build" = build ] || { echo "bundle.sh: $build/modeld or $build/modelctl is missing" >&2; exit 2; }
  ./scripts/build.sh modeld modelctl gpu_probe
fi
rm -rf "$out"
mkdir -p "$out/lib" "$out/tests/device"
for f in modeld modelctl; do
  strip -o "$out/$f" "$build/$f"
done
if [ -x "$build/tests/device/gpu_probe" ]; then
  strip -o "$out/tests/device/gpu_probe" "$build/tests/device/gpu_probe"
fi
# Libraries the device lacks, or has in another version: those ldd resolves for the binaries whose
# names match; the rest (glibc, libstdc++, OpenSSL 3, libsystemd) are there.
ldd "$out/modeld" "$out/modelctl" | awk '$2 == "=>" && $1 ~ /^lib(boost_|spdlog|fmt|tomlplusplus)/ {print $1, $3}' |
  sort -u | while read -r soname path; do
    cp -L "$path" "$out/lib/$soname"
    strip --strip-unneeded "$out/lib/$soname"
  done
size=$(du -sm "$out" | cut -f1)
echo "bundle: $out ($size MiB):"
ls -l "$out" "$out/lib" | sed 's/^/  /'
if [ "$size" -ge 64 ]; then
  echo "bundle.sh: $out is $size MiB, over the 64 MiB a run call carries" >&2
  exit 1
fi
cat <<'EOF'
run it on the device machine (from the repository root; see tests/device/README.md):
  run(carry=["build-gpu"], timeout_s=600,
      command="PYTHONUNBUFFERED=1 python3 tests/device/switch_gpu.py --bundle build-gpu --runs 3 2>&1 | grep -av 'it/s]' | tee $OUT/switch_gpu.log")
EOF
