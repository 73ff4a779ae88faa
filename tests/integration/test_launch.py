"""``python -m pgdash_agent`` under real launchers: torchrun (DDP, FSDP2, a 2-D DeviceMesh, an elastic
restart), torch.multiprocessing.spawn, and the program's own argv and exit codes.

The training scripts in tests/jobs/tutorial/ are written as PyTorch's tutorials write them,
with no pgdash in them: the agent comes only from ``-m pgdash_agent``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from bench.detect import descendants
from tests.helpers.procs import ROOT, free_port, job_by_name, stored_events, wait_for

TUTORIAL = Path(__file__).resolve().parents[1] / "jobs" / "tutorial"
DEADLINE = 240  # torchrun and its ranks start torch several times over on a busy machine


def _env(server_url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("PGDASH_JOB", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                 "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"):
        env.pop(name, None)  # whatever launched the tests must not leak into the jobs
    env.update(PGDASH_SERVER=server_url, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT),
               PGDASH_FLUSH_TIMEOUT_S="30", **extra)
    return env


def run(cmd: list[str], env: dict[str, str], tmp_path: Path, log: str,
        cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run a command to its end (killed past the deadline); its output is kept in tmp_path."""
    try:
        done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=DEADLINE)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{cmd} did not finish in {DEADLINE}s:\n{exc.stderr}") from None
    (tmp_path / log).write_text(done.stdout + done.stderr)
    return done


def torchrun(script: str, nproc: int, name: str, server, tmp_path: Path, args=(),
             extra=(), env=None) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run ... -m pgdash_agent tests/jobs/tutorial/SCRIPT ARGS`` (the
    module form, so the venv's torch runs it), rendezvous on a free loopback port."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
           "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
           "--rdzv-endpoint", "127.0.0.1:0", "--rdzv-id", name, *extra,
           "-m", "pgdash_agent", str(TUTORIAL / script), *args]
    return run(cmd, env or _env(server.url), tmp_path, f"{name}.log")


def finished_job(server, name: str, world: int) -> dict:
    """The job once it has ended, with its details; fails if it never ends."""
    job = wait_for(lambda: (j := job_by_name(server, name)) and
                   j["status"] in ("finished", "failed") and j, 60, f"job {name} to end")
    detail = server.api(f"/api/jobs/{job['id']}")
    assert detail["world_size"] == world
    return detail


def counts(server, job_id: int, source: str = "wrapper") -> dict[tuple[str, str, int], int]:
    """Collectives per group, op and rank, as the wrappers (Python-issued) or the Flight
    Recorder (issued from C++) counted them."""
    rows = server.api(f"/api/jobs/{job_id}/collectives")["collectives"]
    return {(r["group"], r["op"], r["rank"]): r["count"] for r in rows
            if r.get("source", "wrapper") == source}


def serious(server, job_id: int) -> list[dict]:
    return [f for f in server.api(f"/api/jobs/{job_id}/findings")["findings"]
            if f["severity"] in ("warning", "critical")]


def test_ddp_tutorial_under_torchrun(server, tmp_path):
    steps = 5
    done = torchrun("ddp.py", 2, "tut-ddp", server, tmp_path,
                    args=["--steps", str(steps), "--lr", "3e-4"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"trained {steps} steps, lr 0.0003" in done.stdout  # the script's own argv
    # the program and torchrun's --rdzv-id name the job
    job = finished_job(server, "ddp.py \u00b7 tut-ddp", 2)
    assert job["status"] == "finished"
    assert [(r["rank"], r["attempt"], r["status"]) for r in job["ranks"]] == [
        (0, 0, "exited"), (1, 0, "exited")]
    assert [a["attempt"] for a in job["attempts"]] == [0]
    # Python sees the loss all-reduce of every step and the final barrier, and DDP's own
    # gradient all-reduce (one bucket a step for this small model) through the agent's comm
    # hook (pgdash_agent.ddp), without a line of the script: timed like the script's own.
    assert counts(server, job["id"]) == {("0", "all_reduce", 0): 2 * steps,
                                         ("0", "all_reduce", 1): 2 * steps,
                                         ("0", "barrier", 0): 1, ("0", "barrier", 1): 1}
    # DDP's constructor still broadcasts the module's state from C++: the Flight Recorder.
    cpp = counts(server, job["id"], "flight_recorder")
    assert cpp.get(("0", "all_reduce", 0)) is None and cpp.get(("0", "broadcast", 0))
    rows = server.api(f"/api/jobs/{job['id']}/collectives?op=all_reduce")["collectives"]
    for row in rows:
        assert 0 < row["p50_us"] <= row["p99_us"] <= row["max_us"]
    assert serious(server, job["id"]) == []


def test_torchrun_standalone_job_is_named_and_rank_0_says_where_its_page_is(server, tmp_path):
    """`torchrun --standalone` makes a UUID run id: every rank names the job after the
    program and the id's first 8 characters; rank 0, and only rank 0, says on the console
    which job it reports and where its page is."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", "--tee", "2", "-m", "pgdash_agent", str(TUTORIAL / "ddp.py"), "--steps", "2",
           "--lr", "3e-4"]
    done = run(cmd, _env(server.url), tmp_path, "standalone.log")
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = server.api("/api/jobs")["jobs"]
    assert len(jobs) == 1, jobs  # both ranks derived the same name
    name = jobs[0]["name"]
    assert re.fullmatch(r"ddp\.py \u00b7 [0-9a-f]{8}", name), name
    job = finished_job(server, name, 2)
    assert (job["launcher"], job["launcher_id"], job["attempt"], job["imported"]) == (
        "torchrun", name[-8:], 0, False)
    assert job["command"] == f"{TUTORIAL / 'ddp.py'} --steps 2 --lr 3e-4"
    said = [line for line in (done.stdout + done.stderr).splitlines()
            if "pgdash: reporting job" in line]
    assert said == [f'[default0]:pgdash: reporting job "{name}" to {server.url} \u2014 page '
                    f'{server.url}/jobs/{job["id"]}'], done.stderr[-3000:]


def test_fsdp2_tutorial_under_torchrun(server, tmp_path):
    steps, units = 3, 3  # two fully_shard layers and the root
    done = torchrun("fsdp2.py", 2, "tut-fsdp2", server, tmp_path, args=["--steps", str(steps)])
    assert done.returncode == 0, done.stderr[-3000:]
    job = finished_job(server, "fsdp2.py \u00b7 tut-fsdp2", 2)
    assert job["status"] == "finished"
    # Per step: each unit all-gathers for forward; all but the root (which keeps its
    # parameters after forward) all-gather again for backward; each reduce-scatters grads.
    gathers, scatters = steps * (2 * units - 1), steps * units
    assert counts(server, job["id"]) == {
        ("0", "all_gather_single", 0): gathers, ("0", "all_gather_single", 1): gathers,
        ("0", "reduce_scatter_single", 0): scatters,
        ("0", "reduce_scatter_single", 1): scatters}
    assert serious(server, job["id"]) == []


def test_2d_device_mesh_under_torchrun(server, tmp_path):
    steps = 4
    done = torchrun("mesh2d.py", 4, "tut-mesh", server, tmp_path, args=["--steps", str(steps)])
    assert done.returncode == 0, done.stderr[-3000:]
    job = finished_job(server, "mesh2d.py \u00b7 tut-mesh", 4)
    assert job["status"] == "finished"
    groups = {(g["desc"], tuple(g["ranks"])): g["name"] for g in job["groups"]}
    dp = {ranks: name for (desc, ranks), name in groups.items() if desc == "mesh_dp"}
    tp = {ranks: name for (desc, ranks), name in groups.items() if desc == "mesh_tp"}
    # mesh (2, 2) over ranks [[0, 1], [2, 3]]: "tp" along rows, "dp" along columns
    assert sorted(dp) == [(0, 2), (1, 3)] and sorted(tp) == [(0, 1), (2, 3)]
    default = groups[("default_pg", (0, 1, 2, 3))]
    expected = {(default, "barrier", r): 1 for r in range(4)}
    for family in (dp, tp):
        for ranks, name in family.items():
            expected.update({(name, "all_reduce", r): steps for r in ranks})
    assert counts(server, job["id"]) == expected
    assert serious(server, job["id"]) == []


def test_torchrun_restart_is_the_next_attempt_of_the_same_job(server, tmp_path):
    # torch 2.13 with gloo: a restarted attempt reads the first one's addresses from the
    # TCPStore torchrun shares with it and fails to connect (pytorch/pytorch#135712; also
    # without pgdash); not sharing it is the documented way round.
    env = _env(server.url, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    done = torchrun("flaky.py", 2, "tut-restart", server, tmp_path,
                    extra=["--max-restarts", "1"], env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    name = "flaky.py \u00b7 tut-restart"
    jobs = [j for j in server.api("/api/jobs")["jobs"] if j["name"] == name]
    assert len(jobs) == 1, jobs  # one job, not one per attempt
    assert (jobs[0]["attempt"], jobs[0]["launcher"]) == (1, "torchrun")
    job = finished_job(server, name, 2)
    assert job["status"] == "finished"
    first, second = job["attempts"]
    assert (first["attempt"], first["status"]) == (0, "failed")
    assert (second["attempt"], second["status"]) == (1, "finished")
    assert first["ended_at"] <= second["started_at"]
    assert {r["rank"]: r["status"] for r in first["ranks"]}[1] == "failed"
    assert [(r["rank"], r["status"]) for r in second["ranks"]] == [(0, "exited"), (1, "exited")]
    assert [(r["rank"], r["attempt"]) for r in job["ranks"]] == [(0, 1), (1, 1)]
    found = server.api(f"/api/jobs/{job['id']}/findings")["findings"]
    failed = [f for f in found if f["kind"] == "rank_failed"]
    assert [(f["ranks"], f["attempt"], f["active"]) for f in failed] == [([1], 0, False)]
    assert "boom on rank 1 in attempt 0" in failed[0]["evidence"]["error"]
    # nothing of attempt 0 is held against attempt 1, which ran cleanly
    assert [f for f in found if f["active"]] == []


def test_multiprocessing_spawn_ranks_form_one_job(server, tmp_path):
    """The parent only spawns the ranks: it is no rank and makes no job; each spawned rank
    attaches at its init_process_group and they land in one job named by the program and
    its rendezvous."""
    port = free_port()
    done = run([sys.executable, "-m", "pgdash_agent", str(TUTORIAL / "spawn_ddp.py"), "2", str(port),
                "3"], _env(server.url), tmp_path, "spawn.log")
    assert done.returncode == 0, done.stderr[-3000:]
    name = f"spawn_ddp.py \u00b7 127.0.0.1:{port}"
    job = finished_job(server, name, 2)
    assert job["status"] == "finished"
    assert [j["name"] for j in server.api("/api/jobs")["jobs"]] == [name]
    assert (job["launcher"], job["launcher_id"], job["command"]) == (
        "mp.spawn", f"127.0.0.1:{port}", f"{TUTORIAL / 'spawn_ddp.py'} 2 {port} 3")
    # rank 0 said where its page is, once; the parent, no rank, said nothing
    said = [line for line in done.stderr.splitlines() if "pgdash: reporting job" in line]
    assert said == [f'pgdash: reporting job "{name}" to {server.url} \u2014 page '
                    f'{server.url}/jobs/{job["id"]}'], done.stderr[-3000:]
    # 3 steps: DDP's gradient all-reduce (through the agent's comm hook, agent.ddp) and the
    # script's own all_reduce of the loss, each step.
    assert counts(server, job["id"]) == {("0", "all_reduce", 0): 6, ("0", "all_reduce", 1): 6,
                                         ("0", "barrier", 0): 1, ("0", "barrier", 1): 1}
    assert serious(server, job["id"]) == []

    # A spawned rank that raises: torch.multiprocessing catches it (no excepthook runs), so
    # the agent must report it itself.
    port = free_port()
    done = run([sys.executable, "-m", "pgdash_agent", str(TUTORIAL / "spawn_ddp.py"), "2", str(port),
                "3", "1"], _env(server.url), tmp_path, "spawn-fail.log")
    assert done.returncode == 1
    job = finished_job(server, f"spawn_ddp.py \u00b7 127.0.0.1:{port}", 2)
    assert job["status"] == "failed"
    failed = wait_for(lambda: [f for f in server.api(f"/api/jobs/{job['id']}/findings")[
        "findings"] if f["kind"] == "rank_failed"], 30, "the spawned rank's failure")
    assert failed[0]["ranks"] == [1]
    assert "boom in spawned rank 1" in failed[0]["evidence"]["error"]


def test_a_spawned_rank_that_raises_is_named_when_it_attached_itself(server, tmp_path):
    """``attach()`` in each spawned rank, the program run with plain python: torch's wrapper
    in the child catches the error, writes it for the parent and calls ``sys.exit(1)``
    (no excepthook runs; the parent then terminates the other ranks). The agent sees the
    exit and the error it ends the rank for: the failing rank is named with its error,
    the rank that lost its peer is not blamed."""
    port = free_port()
    done = run([sys.executable, str(TUTORIAL / "spawn_ddp.py"), "2", str(port), "3", "1",
                "attach"], _env(server.url, PGDASH_JOB="spawn-attach"), tmp_path,
               "spawn-attach.log")
    assert done.returncode == 1, done.stderr[-3000:]
    job = finished_job(server, "spawn-attach", 2)
    assert job["status"] == "failed"
    failed = wait_for(lambda: [f for f in server.api(f"/api/jobs/{job['id']}/findings")[
        "findings"] if f["kind"] == "rank_failed"], 30, "the spawned rank's failure")
    assert [f["ranks"] for f in failed] == [[1]]
    assert "boom in spawned rank 1" in failed[0]["evidence"]["error"]
    assert [f for f in serious(server, job["id"]) if f["ranks"] != [1]] == []


def test_program_argv_exit_codes_and_tracebacks(server, tmp_path):
    """The program sees what `python SCRIPT ARGS` / `python -m MODULE ARGS` would give it;
    its exit status and traceback come through, and the agent reports the failure."""
    env = _env(server.url, RANK="0", WORLD_SIZE="1")
    report = tmp_path / "report.json"
    script = TUTORIAL / "argv_exit.py"

    done = run([sys.executable, "-m", "pgdash_agent", str(script), str(report), "0"],
               dict(env, PGDASH_JOB="argv-ok"), tmp_path, "ok.log")
    assert done.returncode == 0, done.stderr
    seen = json.loads(report.read_text())
    assert seen == {"argv": [str(script), str(report), "0"], "file": str(script),
                    "path0": str(TUTORIAL), "name": "__main__", "pickled": 7}

    done = run([sys.executable, "-m", "pgdash_agent", "-m", "argv_exit", str(report), "3"],
               dict(env, PGDASH_JOB="argv-3"), tmp_path, "exit3.log", cwd=TUTORIAL)
    assert done.returncode == 3, done.stderr
    seen = json.loads(report.read_text())
    assert seen["argv"] == [str(script), str(report), "3"] and seen["name"] == "__main__"
    assert seen["path0"] == str(TUTORIAL)  # -m: the working directory

    done = run([sys.executable, "-m", "pgdash_agent", str(script), str(report), "raise"],
               dict(env, PGDASH_JOB="argv-raise"), tmp_path, "raise.log")
    assert done.returncode == 1
    plain = run([sys.executable, str(script), str(report), "raise"],
                dict(env, PGDASH_SERVER=""), tmp_path, "plain.log")
    # the same traceback as plain python prints: it starts at the script, not in pgdash
    assert done.stderr.endswith(plain.stderr), (done.stderr, plain.stderr)
    assert plain.stderr.startswith("Traceback (most recent call last):\n  File "
                                   f"\"{script}\", line")

    for name, text in (("argv-3", "the program exited with status 3"),
                       ("argv-raise", "raised on purpose by argv_exit.py")):
        job = finished_job(server, name, 1)
        assert job["status"] == "failed"
        failed = wait_for(lambda: [f for f in server.api(f"/api/jobs/{job['id']}/findings")[
            "findings"] if f["kind"] == "rank_failed"], 30, f"the failure of {name}")
        assert text in failed[0]["evidence"]["error"]

    usage = run([sys.executable, "-m", "pgdash_agent"], env, tmp_path, "usage.log")
    assert usage.returncode == 2 and usage.stderr.startswith("usage: python -m pgdash_agent SCRIPT")
    missing = run([sys.executable, "-m", "pgdash_agent", str(tmp_path / "nope.py")], env, tmp_path,
                  "missing.log")
    assert missing.returncode == 2 and "can't open file" in missing.stderr


def test_slurm_tasks_form_one_job_named_after_the_step(server, tmp_path):
    """Two tasks as `srun` starts them (SLURM's variables, no RANK): one job, named by the
    program and slurm-<job id>.<step id>, each rank known from SLURM_PROCID before
    init_process_group."""
    port = str(free_port())
    procs = []
    for task in (0, 1):
        env = _env(server.url, SLURM_JOB_ID="4242", SLURM_STEP_ID="0",
                   SLURM_PROCID=str(task), SLURM_LOCALID=str(task), SLURM_NTASKS="2",
                   SLURM_NODEID="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        with open(tmp_path / f"task{task}.log", "wb") as out:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "pgdash_agent", str(TUTORIAL / "slurm_job.py")], env=env,
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT))
    try:
        assert [p.wait(timeout=DEADLINE) for p in procs] == [0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    job = finished_job(server, "slurm_job.py \u00b7 slurm-4242.0", 2)
    assert job["status"] == "finished"
    assert (job["launcher"], job["launcher_id"]) == ("slurm", "slurm-4242.0")
    assert [(r["rank"], r["local_rank"]) for r in job["ranks"]] == [(0, 0), (1, 1)]
    # the agents knew their ranks when they connected: from SLURM, before init
    with urllib.request.urlopen(f"{server.url}/api/jobs/{job['id']}/export") as resp:
        lines = [json.loads(line) for line in resp.read().decode().splitlines()]
    connects = [line["event"]["body"] for line in lines
                if "event" in line and line["event"]["kind"] == "connect"]
    assert sorted(c["rank"] for c in connects) == [0, 1]
    assert counts(server, job["id"]) == {("0", "all_reduce", 0): 3, ("0", "all_reduce", 1): 3}


@pytest.mark.parametrize("py_spy", ["installed", "missing"])
def test_a_rank_in_another_collective_when_torchrun_stopped_the_job_is_named_from_its_board(
        server, tmp_path, py_spy):
    """Rank 2 skips validation (an empty slice) and all-reduces gradients where ranks 0 and 1
    all-reduce a loss: gloo aborts a rank over the sizes, torchrun SIGTERMs the rest a tenth of a
    second later, and no rank reports anything. The host reader sends every rank's board
    (pgdash_agent.board) as the SIGTERM reaches it, py-spy or not: the collective each was
    inside names rank 2, and the rank gloo aborted is its consequence, not a finding of its
    own."""
    name = f"tut-boards-{py_spy}"
    env = _env(server.url, **({"PGDASH_PY_SPY": "/nonexistent/py-spy"}
                              if py_spy == "missing" else {}))
    done = torchrun("uneven_eval.py", 3, name, server, tmp_path, env=env)
    assert done.returncode != 0, done.stderr[-2000:]
    job = wait_for(lambda: job_by_name(server, f"uneven_eval.py \u00b7 {name}"), 30, "the job")

    def verdict():
        found = serious(server, job["id"])
        return found if any(f["kind"] == "desync" for f in found) else None

    found = wait_for(verdict, 90, "the desync finding")
    assert [(f["kind"], f["ranks"]) for f in found if f["severity"] == "critical"] == \
        [("desync", [2])], found
    (f,) = found
    assert "2048" in f["summary"] or "8192 bytes" in f["summary"], f["summary"]
    assert f["evidence"]["consequences"], f["evidence"]


def test_a_job_cancelled_by_its_scheduler_blames_no_rank_and_says_how_each_ended(server,
                                                                                 tmp_path):
    """``scancel`` SIGTERMs every process of the job step at once: torchrun, its ranks and the
    host reader. The reader waits a moment for its ranks to end and reads each one's signal
    while torchrun has not reaped it yet: a stop from outside, which no rank is blamed for,
    however the deaths were spaced."""
    name = "tut-cancelled"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
           "--nproc-per-node", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint",
           "127.0.0.1:0", "--rdzv-id", name, "-m", "pgdash_agent",
           str(TUTORIAL / "until_cancelled.py")]
    with open(tmp_path / f"{name}.log", "w+") as out:
        launcher = subprocess.Popen(cmd, env=_env(server.url), cwd=ROOT, stdout=out,
                                    stderr=subprocess.STDOUT, text=True)
        try:
            wait_for(lambda: "steps" in (tmp_path / f"{name}.log").read_text(), DEADLINE,
                     "the ranks to step")
            job = wait_for(lambda: job_by_name(server, f"until_cancelled.py \u00b7 {name}"),
                           30, "the job")
            everyone = [launcher.pid, *descendants(launcher.pid)]
            for pid in everyone:  # the scheduler's SIGTERM, to each process of the step
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            launcher.wait(60)
        finally:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait(60)

    seen = []

    def stopped():  # each rank's end, as the judgements after each one's say
        found = server.api(f"/api/jobs/{job['id']}/findings")["findings"]
        seen[:] = [found]
        return found if any(f["kind"] == "rank_lost" and len(_ended(f["evidence"])) == 3
                            for f in found) else None

    try:
        found = wait_for(stopped, 120, "the job's end to be judged, with each rank's")
    except AssertionError as exc:  # what was judged instead
        ranks = server.api(f"/api/jobs/{job['id']}")["ranks"]
        raise AssertionError(f"{exc}; findings: {seen}; ranks: "
                             f"{[(r['rank'], r['status'], r.get('ended')) for r in ranks]}")
    assert [(f["kind"], f["severity"], f["ranks"]) for f in found] == \
        [("rank_lost", "info", [])], found
    evidence = found[0]["evidence"]
    assert evidence["how"] == "stopped", evidence
    assert set(_ended(evidence)) == {"0", "1", "2"}, evidence
    ended = {r: v.get("ended") for r, v in evidence["lost"].items()}
    assert set(ended.values()) <= {"SIGTERM", None}, ended
    assert "SIGTERM" in ended.values(), ended  # (a rank reaped before its reader looked: None)


def _ended(evidence):
    """The ranks whose end a job-stopped rank_lost accounts for: those lost (each with how
    it ended) and those that failed on their peers' closed connections before their own
    stop came (on a loaded machine the signals are spaced enough for that)."""
    return {*evidence["lost"], *map(str, evidence.get("failed_on_peers", []))}


@pytest.mark.parametrize("launcher", ["torchrun", "mp.spawn"])
def test_a_rank_that_crashes_in_native_code_is_named_with_its_signal(server, tmp_path,
                                                                      launcher):
    """Rank 1 dies of SIGSEGV; its launcher reaps it (torchrun within its monitor interval,
    mp.spawn's parent at once) and stops the others. Under torchrun the host reader's watch
    read the signal as the rank ended, so the finding says what killed it (and points at
    native code), not only that it vanished."""
    if launcher == "torchrun":
        name = "tut-segv"
        done = torchrun("native_crash.py", 3, name, server, tmp_path)
        job_name = f"native_crash.py \u00b7 {name}"
    else:
        port = free_port()
        done = run([sys.executable, "-m", "pgdash_agent", str(TUTORIAL / "spawn_native_crash.py"),
                    str(port)], _env(server.url), tmp_path, "spawn-segv.log")
        job_name = f"spawn_native_crash.py \u00b7 127.0.0.1:{port}"
    assert done.returncode != 0, done.stderr[-2000:]
    job = wait_for(lambda: job_by_name(server, job_name), 30, "the job")

    def named():
        found = serious(server, job["id"])
        return found if any(f["kind"] == "rank_lost" for f in found) else None

    found = wait_for(named, 90, "the lost rank")
    assert [(f["kind"], f["ranks"]) for f in found] == [("rank_lost", [1])], found
    if launcher == "torchrun":
        assert found[0]["evidence"].get("ended") == "SIGSEGV", found[0]["evidence"]
        assert "native code" in found[0]["hint"], found[0]["hint"]
    # (mp.spawn's parent reaps the dead rank the moment it ends, usually before the watch
    # reads it: how it ended is then not known, but its peers' SIGTERM marks say that the
    # parent stopped them after it, however close together they died: before the ranks got
    # boards under mp.spawn, "ranks 0-2 vanished together"). The dead rank's board is always
    # sent; a peer's only where it was stopped too: one that failed on the closed connection
    # first exits through Python, reports its error and takes its board away (CI once).
    boards = [e for e in stored_events(server.db_url, [job["id"]]) if e["kind"] == "boards"]
    sent = {b["rank"] for e in boards for b in e["body"]["boards"]}
    assert 1 in sent and sent <= {0, 1, 2}, boards
