"""A big simulated job stored in a SQLite file through the live path, for the tests of
scrubbing it over HTTP and in the page."""

from __future__ import annotations

import argparse
import sqlite3
from pathlib import Path

from bench.storage import T0, simulate


def stored_job(db: Path, ranks: int, seconds: int) -> tuple[int, float, float]:
    """A job of ``ranks`` ranks that ran ``seconds`` and ended, each rank sending what an agent
    sends at its defaults, one of them hung from a third of the way to two thirds
    (bench.storage's simulation, live fold, keyframes and all). (job id, start, end)"""
    minutes = seconds / 60
    args = argparse.Namespace(ranks=ranks, minutes=minutes, hang_at=minutes / 3,
                              hang_for=minutes / 3, ops=4, seed=1, end=True, keep_full=0,
                              keep_around_findings=0, pack_after=None, checkpoint_keep=0,
                              checkpoint_every=None, keyframe_every=10.0,
                              prepare_end=False)  # (the grid's keyframes alone: those tests')
    run = simulate(args, db)
    run["store"].writer.wait_idle()
    run["store"].close()
    return run["job_id"], T0, run["end"]


def keyframe_moments(db: Path, job_id: int) -> list[float]:
    """The moments of the job's stored keyframes (the live fold leaves some to scrubs: how
    many depends on how long rendering took on this machine)."""
    con = sqlite3.connect(db)
    try:
        return sorted(r[0] for r in con.execute("SELECT at FROM keyframes WHERE job_id = ?",
                                                (job_id,)))
    finally:
        con.close()
