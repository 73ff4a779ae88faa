"""pgdash serve's garbage collection (dashboard.garbage): after ``tune`` the allocations of
a busy server no longer start collections, and ``collect_every`` collects cyclic garbage on
its timer. In a process of its own: the policy is process-wide."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers.procs import ROOT

PROBE = """
import gc, threading, time, weakref
from dashboard import garbage

class Node:
    pass

def cycles(n):
    made = []
    for _ in range(n):
        a, b = Node(), Node()
        a.other, b.other = b, a
        made.append(weakref.ref(a))
    return made

garbage.tune()
dead = cycles(1000)
# Then many more tracked objects than CPython's threshold of 700 (and the old 50,000),
# held: what a busy server holds between an agent's frame and its fold.
held = [[i] for i in range(200_000)]
time.sleep(0.3)
assert all(r() is not None for r in dead), "an allocation started a collection"

garbage.GC_EVERY_S = 0.05
stop = threading.Event()
timer = threading.Thread(target=garbage.collect_every, args=(stop,))
timer.start()
deadline = time.monotonic() + 10
while any(r() is not None for r in dead) and time.monotonic() < deadline:
    time.sleep(0.05)
stop.set()
timer.join(5)
assert not timer.is_alive(), "the collector did not stop when told"
assert all(r() is None for r in dead), "the timer did not collect the cycles"
assert len(held) == 200_000
print("ok")
"""


def test_allocations_start_no_collection_and_the_timer_collects_cycles():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
