"""The cyclic garbage collector as ``pgdash serve`` runs it: on a timer, not by allocations.

CPython collects the young generation each time the tracked objects made outnumber those
freed by the first threshold (700). In this server the events between an agent's frame and
their fold (dicts, the latency histograms' [bucket, count] lists: ~150,000 at 1,024 ranks,
held a second or two) are such a surplus: at a threshold of 50,000 three collections a
second scanned them, ~9% of a core, and found next to no garbage (bench/capacity.py, docs/
internals.md). Reference counting frees almost everything; the collector is only for
cycles, which pgdash's data does not make in steady state. So :func:`tune` sets the
threshold far above that surplus (a safety net for a burst of cycles), and
:func:`collect_every` collects every GC_EVERY_S (the server's main thread runs it). The
benches that measure what a server does (bench/storage.py's scrubs) run under :func:`tune`
too.
"""

from __future__ import annotations

import gc
import threading

GC_THRESHOLD = 2_000_000  # tracked objects made, net, between young collections (CPython's 700)
GC_EVERY_S = 10.0  # the young and middle generations collected this often
GC_FULL_EVERY = 30  # ... and every generation at every 30th (5 minutes)


def tune() -> None:
    """Collect now, freeze what start-up built (never collected again) and leave the rest to
    :func:`collect_every`."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, 50, 1000)


def collect_every(stop: threading.Event) -> None:
    """Collect cyclic garbage every GC_EVERY_S until ``stop`` is set."""
    rounds = 0
    while not stop.wait(GC_EVERY_S):
        rounds += 1
        gc.collect(2 if rounds % GC_FULL_EVERY == 0 else 1)
