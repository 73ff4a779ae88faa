"""Each finding kind on a real fault-injected gloo job, with the blame checked exactly."""

from __future__ import annotations

import time

import pytest

from tests.helpers.procs import ServerProcess, job_by_name, launch_job, wait_for, wait_job

HANG_AFTER = 3


@pytest.fixture
def diag_server(tmp_path):
    srv = ServerProcess(f"sqlite:///{tmp_path / 'pgdash.db'}", log_path=tmp_path / "server.log",
                        extra=["--hang-after", str(HANG_AFTER)]).start()
    yield srv
    srv.stop()


def findings(server, name):
    job = job_by_name(server, name)
    return server.api(f"/api/jobs/{job['id']}/findings")["findings"] if job else []


def wait_finding(server, name, kind, group=None, timeout=30):
    return wait_for(lambda: next((f for f in findings(server, name)
                                  if f["kind"] == kind and f["active"]
                                  and (group is None or f["group"] == group)), None),
                    timeout, f"a {kind} finding for {name}")


def run_fault(server, tmp_path, scenario, world, name=None, **kw):
    name = name or scenario
    procs = launch_job("fault_job.py", world, server.url, name, tmp_path, args=[scenario], **kw)
    return name, procs


def stop(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


@pytest.mark.parametrize("scenario, kind, blamed", [
    ("hang", "hang", [2]),
    ("chain", "hang", [2]),
    ("desync", "desync", [2]),
])
def test_stuck_collectives_are_blamed_on_the_right_rank(diag_server, tmp_path, scenario, kind,
                                                        blamed):
    name, procs = run_fault(diag_server, tmp_path, scenario, 3)
    try:
        f = wait_finding(diag_server, name, kind, group="0")
        assert f["ranks"] == blamed
        kinds = {x["kind"] for x in findings(diag_server, name) if x["active"]}
        if kind == "desync":
            assert "hang" not in kinds, "a desync that hangs is a desync, not a hang"
            assert f["evidence"]["signatures"]["2"]["op"] == "broadcast"
        else:
            f = wait_for(lambda: next((x for x in findings(diag_server, name)
                                      if x["kind"] == "hang" and x["group"] == "0"
                                      and x["evidence"]["stacks"]), None),
                         15, "the stuck ranks' stacks")
            assert "fault_job.py" in next(iter(f["evidence"]["stacks"].values()))
        if scenario == "chain":
            assert f["evidence"]["chain"][0]["rank"] == 1
            assert f["evidence"]["chain"][0]["for"] == [2]
    finally:
        stop(procs)


@pytest.mark.parametrize("hook, source", [("0", "flight_recorder"), ("1", "python")],
                         ids=["flight-recorder", "ddp-comm-hook"])
def test_hang_inside_ddp_is_seen(diag_server, tmp_path, hook, source):
    """Through the Flight Recorder when DDP is left alone (PGDASH_DDP_HOOK=0), through the
    wrappers with the agent's comm hook (the default): the same culprit either way."""
    name, procs = run_fault(diag_server, tmp_path, "ddp-hang", 3,
                            env={"PGDASH_DDP_HOOK": hook})
    try:
        f = wait_finding(diag_server, name, "hang", group="0")
        assert f["ranks"] == [2] and f["evidence"]["source"] == source
        # Ranks pass --hang-after one by one; soon both are listed as waiting.
        wait_for(lambda: next((x for x in findings(diag_server, name) if x["kind"] == "hang"
                               and x["evidence"]["waiting"] == [0, 1]), None),
                 15, "both waiting ranks")
        f = wait_for(lambda: next((x for x in findings(diag_server, name)
                                   if x["kind"] == "hang" and x["evidence"]["stacks"]), None),
                     15, "the waiting ranks' stacks")
        assert "backward" in f["evidence"]["stacks"]["0"]
    finally:
        stop(procs)


@pytest.mark.parametrize("scenario, kind, evidence", [
    ("crash", "rank_failed", "injected failure on rank 1"),  # it raised
    ("kill", "rank_lost", None),  # SIGKILL, as the OOM killer does
])
def test_a_dead_rank_is_blamed_not_its_victims(diag_server, tmp_path, scenario, kind, evidence):
    name, procs = run_fault(diag_server, tmp_path, scenario, 3)
    try:
        f = wait_finding(diag_server, name, kind)
        assert f["ranks"] == [1]
        if evidence:
            assert evidence in f["evidence"]["error"]
        wait_job(procs, 60)  # the others fail with "Connection closed by peer" and the like
        active = [x for x in findings(diag_server, name) if x["active"]]
        assert {r for x in active for r in x["ranks"]} == {1}, active
    finally:
        stop(procs)


def test_missing_rank_at_rendezvous_is_named(diag_server, tmp_path):
    name, procs = run_fault(diag_server, tmp_path, "healthy", 3, name="init",
                            only=[0, 1])
    try:
        f = wait_finding(diag_server, name, "init_incomplete")
        assert f["ranks"] == [2] and f["evidence"]["arrived"] == [0, 1]
    finally:
        stop(procs)


def test_mismatched_setting_is_flagged(diag_server, tmp_path):
    name, procs = run_fault(diag_server, tmp_path, "healthy", 3, name="config",
                            rank_env={2: {"NCCL_ALGO": "Tree"}})
    try:
        f = wait_finding(diag_server, name, "config_mismatch")
        assert f["ranks"] == [2] and f["evidence"]["key"] == "NCCL_ALGO"
        assert wait_job(procs, 60) == [0, 0, 0]
    finally:
        stop(procs)


def test_healthy_job_has_no_findings(diag_server, tmp_path):
    name, procs = run_fault(diag_server, tmp_path, "healthy", 3, name="fine")
    try:
        assert wait_job(procs, 90) == [0, 0, 0]
        wait_for(lambda: job_by_name(diag_server, name)["status"] == "finished", 20,
                 "the job to finish")
        assert findings(diag_server, name) == []
    finally:
        stop(procs)


def test_straggler_is_named(diag_server, tmp_path):
    name = "straggler"
    procs = launch_job("fault_job.py", 3, diag_server.url, name, tmp_path,
                       args=["straggler", "3", "150"])
    try:
        f = wait_finding(diag_server, name, "straggler", timeout=40)
        assert f["ranks"] == [2] and f["group"] == "0"
        others = [v for r, v in f["evidence"]["median_wait_us"].items() if r != "2"]
        assert min(others) > 3 * f["evidence"]["median_wait_us"]["2"]
    finally:
        stop(procs)


def test_a_straggler_behind_ddp_is_named_not_the_peer_waiting_for_it(diag_server, tmp_path):
    """The demo's layout: DDP on dp groups {0, 2} and {1, 3}, Python all-reduces on tp groups
    {0, 1} and {2, 3}; rank 3's steps take 30 % longer. Rank 1 waits for it inside DDP's C++
    all-reduce, so in tp group {0, 1} rank 0 waits for rank 1: every straggler finding must
    still name rank 3."""
    name = "ddp-straggler"
    procs = launch_job("train_job.py", 4, diag_server.url, name, tmp_path,
                       args=["--scenario", "straggler", "--fault-step", "20",
                             "--step-time", "0.05"])
    try:
        def stragglers():
            return [f for f in findings(diag_server, name) if f["kind"] == "straggler"]

        # Both tp groups wait: {2, 3} for rank 3 directly, {0, 1} for rank 1, then for 3.
        wait_for(lambda: len({f["group"] for f in stragglers()}) >= 2 or None, 60,
                 "straggler findings in both tensor-parallel groups")
        time.sleep(3)

        def traced():
            # Rank 1 waits for rank 3 in DDP's all-reduce: seen by the wrappers through the
            # agent's comm hook ("chain"), or by the Flight Recorder's samples
            # ("waits_in_cpp"). On a loaded machine the windows that show it may take a few
            # more judgements to fill (a CPU hog beside the whole suite once had none yet).
            found = stragglers()
            via = [f["evidence"].get("chain") or f["evidence"]["waits_in_cpp"] for f in found
                   if {"chain", "waits_in_cpp"} & set(f["evidence"])]
            return (found, via) if via else None

        found, via = wait_for(traced, 60, "a straggler finding tracing rank 1's wait to rank 3")
        assert [f["ranks"] for f in found] == [[3]] * len(found), [
            (f["group"], f["ranks"], f["first_seen"], f["evidence"]) for f in found]
        assert all(chain[0]["waits"] == 1 and chain[0]["rank"] == 3 for chain in via)
    finally:
        stop(procs)


def test_healthy_four_rank_training_stays_silent(diag_server, tmp_path):
    """DDP plus a 2x2 mesh, four ranks on this small machine, for 300 steps (~40 s): no
    warning and no critical finding, although the oversubscribed cores make waits noisy."""
    procs = launch_job("train_job.py", 4, diag_server.url, "healthy-train", tmp_path,
                       args=["--steps", "300", "--step-time", "0.05"])
    try:
        assert wait_job(procs, 240, tmp_path) == [0, 0, 0, 0]
        job = wait_for(lambda: (j := job_by_name(diag_server, "healthy-train"))
                       and j["status"] == "finished" and j, 20, "the job to finish")
        assert job["world_size"] == 4
        loud = [f for f in findings(diag_server, "healthy-train") if f["severity"] != "info"]
        assert loud == [], [(f["kind"], f["ranks"], f["summary"], f["evidence"]) for f in loud]
    finally:
        stop(procs)
