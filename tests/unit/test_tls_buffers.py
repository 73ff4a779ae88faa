"""dashboard.ingest.tls.small_read_buffers: each TLS connection of the server reads into
READ_BUFFER bytes, not asyncio's 256 kB (resident: zero-filled). In a subprocess, since it
changes a class setting of the process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers.procs import ROOT

# asyncio's TLS has had a read buffer of its own (SSLProtocol.max_size) since 3.11; before,
# small_read_buffers has nothing to set.
pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio 3.11's TLS")

PROBE = """
import asyncio, ssl, sys
from asyncio import sslproto
from dashboard.ingest import tls

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

if sys.argv[1] == "small":
    tls.small_read_buffers()
    assert sslproto.SSLProtocol.max_size == tls.READ_BUFFER
loop = asyncio.new_event_loop()
context = ssl.create_default_context()
before = rss()
kept = [sslproto.SSLProtocol(loop, asyncio.Protocol(), context, None) for _ in range(200)]
print(rss() - before)
"""


def _held(how: str) -> int:
    done = subprocess.run([sys.executable, "-c", PROBE, how], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def test_two_hundred_tls_connections_hold_a_few_megabytes_of_read_buffers_not_fifty():
    assert _held("default") > 40 * 2**20  # 200 x 256 kB, resident
    assert _held("small") < 12 * 2**20  # 200 x 32 kB, and the rest of each connection


def test_a_smaller_setting_is_left_as_it_is():
    code = ("from asyncio import sslproto; from dashboard.ingest import tls; "
            "sslproto.SSLProtocol.max_size = 4096; tls.small_read_buffers(); "
            "print(sslproto.SSLProtocol.max_size)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.strip() == "4096", done.stderr
