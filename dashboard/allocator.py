"""glibc's heap, kept from holding on to what pgdash freed.

The compactor's passes (dashboard.storage.compaction) build and free tens of megabytes at a
time (a 128-rank job's minute of events is ~57 MB of objects, its pack's buffers ~60 MB
more). glibc then keeps the freed space: after the first multi-megabyte buffer is freed it
raises its threshold for giving large blocks their own mapping (up to 32 MiB) and its trim
threshold with it, so later buffers come from the heap and stay there. Measured with
``python -m bench.memory`` at 128 ranks: RSS 80 MB idle, 231 MB after 6 minutes, 88 MB of it
free inside glibc's heaps. Two remedies, both no-ops off glibc:

* :func:`fix_mmap_threshold` (at ``pgdash serve``'s start): large blocks keep their own
  mapping, given back when freed, whatever came before (the threshold stops moving). The
  price: a block that large made and freed often costs a mapping each time, so hot paths
  must not (asyncio's plain reads allocate 256 KiB each: dashboard.ingest.front.AgentLink
  reads into one buffer instead);
* :func:`trim` (after each compaction pass that did work): ``malloc_trim(0)`` gives back
  the free space at the heaps' ends and their free pages (0.2-0.3 ms a call).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform

M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)
MMAP_THRESHOLD = 256 * 1024  # blocks this large or larger get a mapping of their own


@functools.lru_cache(maxsize=1)
def _glibc() -> ctypes.CDLL | None:
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def fix_mmap_threshold() -> bool:
    """Give blocks of MMAP_THRESHOLD bytes and more their own mapping, for good (turns
    glibc's moving threshold off). False where it cannot (not glibc)."""
    libc = _glibc()
    return bool(libc is not None and libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def trim() -> bool:
    """Hand the free memory of glibc's heaps back to the system. False off glibc."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
