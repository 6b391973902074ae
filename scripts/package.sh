#!/bin/sh
# Builds the Debian package from a build tree: scripts/package.sh [BUILD_DIR] [VERSION]
#   BUILD_DIR  a CMake build folder (default: build/, configured here if it is not yet);
#   VERSION    the package version (default: the project's, from CMakeLists.txt).
# Builds only modeld and modelctl (nothing when they are up to date), then runs CPack's DEB
# generator; prints the path of BUILD_DIR/packages/modeld_VERSION_ARCH.deb. Re-running it with
# another VERSION re-packages the same binaries (the test's upgrade does that).
# Needs dpkg-dev (dpkg-shlibdeps) and, for the man pages and changelog, gzip.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
case "$build" in /*) ;; *) build=$(pwd)/$build ;; esac
export CCACHE_NOHASHDIR=1
export CCACHE_BASEDIR="$root"

if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
elif [ ! -f "$build/CPackConfig.cmake" ]; then
    # A build tree configured before cmake/install.cmake existed: configure it again.
    cmake "$build" >/dev/null
fi
# The package never carries test hooks (crash points): a tree built with them (the default) is
# switched off for the package and back on afterwards; only util/test_hooks.cpp is recompiled.
hooks=$(sed -n 's/^MODELD_TEST_HOOKS:BOOL=//p' "$build/CMakeCache.txt")
[ "$hooks" = OFF ] || cmake -DMODELD_TEST_HOOKS=OFF "$build" >/dev/null
# The build tool regenerates the tree first when a CMake file changed.
cmake --build "$build" --target modeld modelctl -j "${MODELD_JOBS:-2}" >&2

version=${2:-$(sed -n 's/^set(CPACK_PACKAGE_VERSION "\(.*\)")$/\1/p' "$build/CPackConfig.cmake")}
case "$version" in
    ''|*[!0-9A-Za-z.+~]*|[!0-9]*) echo "package.sh: bad version '$version' (digits first; 0-9A-Za-z.+~)" >&2; exit 2 ;;
esac

# MODELD_PACKAGE_VERSION reaches the install step (changelog entry, man pages);
# CPACK_PACKAGE_VERSION the control file and the file name.
cd "$build"
MODELD_PACKAGE_VERSION=$version cpack -G DEB -D CPACK_PACKAGE_VERSION="$version" >&2
deb=$build/packages/modeld_${version}_$(dpkg --print-architecture).deb
[ -f "$deb" ] || { echo "package.sh: cpack did not write $deb" >&2; exit 1; }
if [ "$hooks" != OFF ]; then
    cmake -DMODELD_TEST_HOOKS=ON "$build" >/dev/null
    cmake --build "$build" --target modeld modelctl -j "${MODELD_JOBS:-2}" >&2
fi
echo "$deb"
