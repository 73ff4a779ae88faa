"""dashboard.allocator on this machine's glibc: with the threshold fixed, a large block freed
after a bigger one was is still given its own mapping (so it goes back to the system when
freed); glibc's default would have raised its threshold and kept it in the heap."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from tests.helpers.procs import ROOT

PROBE = """
import ctypes, sys
from dashboard import allocator

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "fixed":
    assert allocator.fix_mmap_threshold()
big = ctypes.create_string_buffer(8 << 20)
del big  # a compaction pass's buffer, freed: glibc raises its threshold past 8 MB
mapped = libc.mallinfo2().hblkhd
block = libc.malloc(1 << 20)  # the next pass's buffer
print(libc.mallinfo2().hblkhd - mapped)
assert allocator.trim()
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator only")
@pytest.mark.parametrize(("how", "mapped"), [("default", False), ("fixed", True)])
def test_a_large_block_after_a_larger_one_is_mapped_apart_only_with_the_threshold_fixed(
        how, mapped):
    done = subprocess.run([sys.executable, "-c", PROBE, how], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (int(done.stdout) >= 1 << 20) is mapped, done.stdout
