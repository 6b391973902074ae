"""The page cache and disk reads as the test measures them, independently of modeld.

  * resident(path): bytes of a file in the page cache (mincore(2) over a read-only mapping);
  * wait_resident(paths, at_least): waits until files hold at least so many bytes in the page
    cache (one reading may miss pages the kernel is migrating at that moment);
  * drop(path): drops a file's clean pages (posix_fadvise DONTNEED), so a later measure of
    warming starts from a cold file whatever wrote it;
  * ext4_models(work, size): WORK/models as an ext4 file system in a loop image, for tests whose
    measure means nothing on a tmpfs (there every page is resident and none can be dropped);
  * fs_type(path): the type of the file system holding `path` (findmnt);
  * no_readahead(path): the kernel's readahead off on the device of `path`'s file system for a
    while, so that what is resident is what was read, page for page;
  * process_io(systemd, pid): /proc/PID/io of a process of a namespaced systemd (read_bytes: what
    it made the block layer read; rchar: what its read calls returned, the page cache included).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import subprocess
from pathlib import Path

from waiting import NotYet, wait_for

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def resident(path: Path) -> int:
    """Bytes of `path` in the page cache (mincore over a read-only mapping); the last page counts
    only up to the file's end."""
    size = path.stat().st_size
    if size == 0:
        return 0
    page = mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vec = ctypes.create_string_buffer((size + page - 1) // page)
            assert _libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
            pages = [b & 1 for b in vec.raw]
            return sum(pages[:-1]) * page + pages[-1] * (size - (len(pages) - 1) * page)
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def resident_total(paths: list[Path]) -> int:
    return sum(resident(p) for p in paths)


def wait_resident(paths: list[Path], at_least: int, timeout: float = 30) -> int:
    """Waits until `paths` hold at least `at_least` bytes in the page cache; returns that reading.
    One reading can miss pages for a moment (seen here: a few pages, or a 256 KiB folio, absent
    and back a moment later with nothing reading them: the kernel migrating them, the copy marked
    up to date only once in place), so a low reading is not absence; a page that was never read
    does not come back."""
    def enough() -> int:
        n = resident_total(paths)
        if n < at_least:
            raise NotYet(f"{n} of {at_least} bytes: " + ", ".join(f"{p.name} {resident(p)}" for p in paths))
        return n
    return wait_for(f"{at_least} bytes of {len(paths)} files in the page cache", enough, timeout=timeout)


def drop(path: Path) -> None:
    """Drops the file's clean pages from the page cache (posix_fadvise DONTNEED)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def fs_type(path: Path) -> str:
    """The type of the file system `path` lies on, e.g. "ext4" or "tmpfs"."""
    out = subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "--target", str(path)], capture_output=True,
                         text=True, check=True).stdout
    return out.strip()


@contextlib.contextmanager
def no_readahead(path: Path):
    """Turns readahead off (blockdev --setra 0) on the block device holding `path`'s file system
    until the block ends, then restores it; a file opened meanwhile reads from disk only the pages
    asked for. Needs root and a block device (a loop image's): fails otherwise."""
    device = subprocess.run(["findmnt", "-n", "-o", "SOURCE", "--target", str(path)], capture_output=True,
                            text=True, check=True).stdout.strip()
    before = subprocess.run(["blockdev", "--getra", device], capture_output=True, text=True,
                            check=True).stdout.strip()
    subprocess.run(["blockdev", "--setra", "0", device], check=True)
    try:
        yield device
    finally:
        subprocess.run(["blockdev", "--setra", before, device], check=True)


@contextlib.contextmanager
def ext4_models(work: Path, size: int):
    """WORK/models as an ext4 file system in a loop image of `size` bytes (WORK/models.ext4),
    mounted before the namespaced systemd boots (so modeld sees it), unmounted afterwards;
    yields WORK. Needs root and a loop device: without them it fails, never skips."""
    models, image = work / "models", work / "models.ext4"
    models.mkdir(parents=True, exist_ok=True)
    with open(image, "wb") as f:
        f.truncate(size)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(models)], check=True)
    try:
        assert fs_type(models) == "ext4", fs_type(models)
        yield work
    finally:
        subprocess.run(["umount", "-l", str(models)], check=False)


def process_io(systemd, pid: int) -> dict[str, int]:
    """/proc/PID/io of `pid` as the namespace of `systemd` (a NamespacedSystemd) numbers it, as
    {"rchar": ..., "read_bytes": ..., ...}; every thread's reads, the exited ones' included."""
    out = systemd.run(["cat", f"/proc/{pid}/io"], check=True).stdout
    fields = (line.split(":", 1) for line in out.splitlines() if ":" in line)
    return {k.strip(): int(v) for k, v in fields}
