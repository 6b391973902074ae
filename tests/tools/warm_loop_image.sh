#!/bin/sh
# The disk-backed folder the warm stage's unit tests measure the page cache in (CTest fixture
# warm_loop, tests/CMakeLists.txt): an ext4 file system in a loop image under the build folder,
# mounted at DIR/mnt, as on a host whose /tmp is a tmpfs (where mincore shows every page resident).
#
#     warm_loop_image.sh setup DIR     makes DIR/image.ext4 and mounts it on DIR/mnt
#     warm_loop_image.sh cleanup DIR   unmounts DIR/mnt and removes the image
#
# Setup fails (and so every case that requires the fixture fails) without root, loop devices or
# mkfs.ext4 (e2fsprogs, scripts/install-deps.sh): the cases never run on another folder.
set -eu

usage() {
  echo "usage: $0 setup|cleanup DIR" >&2
  exit 2
}
[ $# -eq 2 ] || usage
dir=$2
image=$dir/image.ext4
mnt=$dir/mnt

unmount() {
  if mountpoint -q "$mnt"; then umount "$mnt"; fi
}

case $1 in
  setup)
    command -v mkfs.ext4 >/dev/null || { echo "mkfs.ext4 is missing (e2fsprogs, scripts/install-deps.sh)" >&2; exit 1; }
    mkdir -p "$mnt"
    unmount  # one left by a run that was killed before its cleanup
    rm -f "$image"
    truncate -s 128M "$image"
    mkfs.ext4 -q -F "$image"
    if ! mount -o loop "$image" "$mnt"; then
      echo "cannot mount $image on $mnt: the warm tests need root and loop devices" >&2
      exit 1
    fi
    chmod 1777 "$mnt"
    echo "ext4 loop image mounted on $mnt"
    ;;
  cleanup)
    unmount
    rm -f "$image"
    echo "unmounted $mnt"
    ;;
  *) usage ;;
esac
