"""The fault corpus (bench/corpus/) judged through bench/detect.py --corpus's own code.

A fast subset of real scripts, each run against a fresh ``pgdash serve`` at its defaults: the
right verdict (kind and culprit) must come, and no warning/critical finding may blame another
rank (for a healthy script: none at all). No speed is asserted here (the machine may be
loaded); the bench measures the latencies against the goals (``python -m bench.detect
--corpus``). The header of every script is checked too.
"""

from __future__ import annotations

import random

import pytest

from bench import detect
from tests.helpers.procs import ROOT

# One per behaviour the subset must hold: a point-to-point pipeline freeze, a clean early
# exit, a hang stopped by Ctrl-C, a healthy job, a broadcast whose root differs on one rank
# (the agent's wrappers report roots; the finished rank's vote decides), ranks waiting in
# store.get for a stuck rank 0 (no collective in flight: progress, CPU and snapshots decide),
# an all_reduce whose reduce op differs on one rank (every call completes: the agents' call
# fingerprints decide), a process a non-daemon thread keeps alive after its script ended,
# two processes claiming one rank, a rank that skipped a new_group call (the agents' counts
# of their new_group calls decide, though the odd call hangs).
SUBSET = ["p2p_isend_irecv_freeze", "ddp_early_return", "hang_stopped_sigint", "healthy_fsdp",
          "broadcast_src_mismatch", "store_wait_rank0_hangs", "allreduce_op_mismatch",
          "hang_at_exit_nondaemon_thread", "init_duplicate_rank", "new_group_skipped_one_rank"]

KINDS = {"init_incomplete", "init_failed", "config_mismatch", "hang", "stall", "desync",
         "straggler", "rank_lost", "rank_failed", "gpu_fault", "gpu_throttle",
         "slow_collective", "rank_exited_early"}


def test_every_corpus_script_has_a_valid_header():
    specs = detect.corpus_specs()
    assert len(specs) >= 30
    for spec in specs:
        text = spec.path.read_text()
        assert spec.kinds <= KINDS, spec.name
        assert 1 <= spec.ranks <= 4, spec.name  # (one: a new user's first try)
        assert all(0 <= r < spec.ranks for r in spec.culprit), spec.name
        if spec.healthy:
            assert "FAULT" not in text, f"{spec.name}: a healthy script prints no FAULT line"
            if spec.stop_after is not None:
                assert "MARK {time.time()" in text, f"{spec.name}: stop_after counts from MARK"
        else:
            assert "FAULT {time.time()" in text, f"{spec.name}: no FAULT line printed"
            assert "CORPUS_SEED" in text or spec.cls == "init", \
                f"{spec.name}: the fault's timing does not vary with CORPUS_SEED"
        if spec.unit == "steps":
            assert "STEP {" in text, f"{spec.name}: a straggler prints STEP lines"
        if spec.launch == "script":
            assert "attach(" in text, f"{spec.name}: a script that starts its ranks attaches"
        assert spec.tolerate <= KINDS, spec.name
    names = {s.name for s in specs}
    assert set(SUBSET) <= names
    assert sum(1 for s in specs if s.healthy) >= 8
    assert {s.launch for s in specs} == {"torchrun", "agent", "script"}


def test_a_broken_header_is_named(tmp_path):
    (tmp_path / "bad.py").write_text('"""No header here."""\n')
    with pytest.raises(ValueError, match="bad.py"):
        detect.corpus_specs(tmp_path)
    (tmp_path / "bad.py").write_text('"""x\nEXPECT kind=hang ranks=3 launch=agent\n"""\n')
    with pytest.raises(ValueError, match="culprit"):
        detect.corpus_specs(tmp_path)
    (tmp_path / "bad.py").write_text('"""x\nEXPECT kind=hang culprit=1 ranks=3 launch=agent '
                                     'tolerate=stall\n"""\n')
    with pytest.raises(ValueError, match="tolerate= is for healthy"):
        detect.corpus_specs(tmp_path)


@pytest.mark.parametrize("name", SUBSET)
def test_corpus_script_gets_the_right_verdict(name, tmp_path):
    (spec,) = detect.corpus_specs(only=[name])
    seed = random.Random(name).randint(0, 999_999)
    run = detect.run_corpus_script(spec, 1, seed, ROOT, tmp_path, settle_s=3.0)
    detail = "\n".join([f"{run.status}: {run.why}", *run.notes,
                        *(f"loud: {f}" for f in run.loud)])
    assert run.status != "ERROR", f"the script or the bench broke:\n{detail}"
    if spec.healthy:
        assert not run.victims, f"a healthy job got warnings/criticals:\n{detail}"
        return
    assert run.verdict is not None, (f"no {spec.kind} finding or incident blaming "
                                     f"{spec.culprit}:\n{detail}")
    assert not run.victims, f"a victim was blamed:\n{detail}"
    if spec.stop_after is not None:
        assert run.stop_t is not None, f"the job was never stopped:\n{detail}"
