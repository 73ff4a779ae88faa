"""Launchers and attempts on plain data: job names, the program and command line of each
launch, ranks from SLURM, the attempt of a process, and a restarted job folded and diagnosed
attempt by attempt (no server, no clock)."""

import os

import pytest

from pgdash_agent import identity
from pgdash_agent.wire import (MAX_COMMAND, MAX_NAME, PROTOCOL_VERSION, WireError, decode_v2,
                        encode_v2, validate_auth, validate_event)
from dashboard.web import views
from dashboard.diagnosis import Settings, diagnose
from dashboard.ingest.pipeline import Ingest
from dashboard.storage.store import Store
from tests.helpers.events import Log, hello

S = Settings(hang_after=10.0, lost_after=15.0)


PY = "/usr/bin/python3"
AGENT_MAIN = os.path.join(os.path.dirname(identity.__file__), "__main__.py")
RUN_ID = "6fd5bf1d-2c3e-4b5a-9d8e-0123456789ab"  # torchrun --standalone makes a uuid4
TRAIN = (["train.py", "--lr", "3e-4"], [PY, "-u", "train.py", "--lr", "3e-4"])


@pytest.mark.parametrize("env, name", [
    ({"PGDASH_JOB": "mine", "TORCHELASTIC_RUN_ID": "r", "SLURM_JOB_ID": "7"}, "mine"),
    ({"TORCHELASTIC_RUN_ID": RUN_ID, "MASTER_ADDR": "a", "MASTER_PORT": "1"},
     "train.py \u00b7 6fd5bf1d"),
    ({"TORCHELASTIC_RUN_ID": "r1", "SLURM_JOB_ID": "7", "MASTER_ADDR": "a",
      "MASTER_PORT": "1"}, "train.py \u00b7 r1"),  # --rdzv-id as the user gave it
    ({"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "2"},
     "train.py \u00b7 slurm-7.2"),
    ({"SLURM_JOB_ID": "7", "MASTER_ADDR": "a", "MASTER_PORT": "1"}, "train.py \u00b7 slurm-7"),
    ({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}, "train.py \u00b7 10.0.0.1:29500"),
    ({}, "train.py"),
])
def test_job_name_from_each_launcher(env, name):
    assert identity.job_name(env, *TRAIN) == name


def test_job_name_without_a_program_is_the_launch_alone():
    assert identity.job_name({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}, ["-c"],
                             [PY, "-c", "pass"]) == "10.0.0.1:29500"
    assert identity.job_name({}, [""], [PY]) == identity.UNNAMED


def test_job_name_from_init_method_when_the_environment_has_no_address():
    assert identity.job_name({}, *TRAIN, init_method="tcp://10.0.0.1:23456") == \
        "train.py \u00b7 10.0.0.1:23456"
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert identity.job_name(env, *TRAIN, init_method="tcp://10.0.0.1:23456") == \
        "train.py \u00b7 127.0.0.1:29500"


@pytest.mark.parametrize("argv, orig_argv, program, command", [
    # python train.py ARGS, and torchrun's workers (python -u train.py ARGS)
    (*TRAIN, "train.py", "train.py --lr 3e-4"),
    # python -m pgdash_agent train.py / torchrun -m pgdash_agent train.py: attached before the launcher
    # hands sys.argv to the program ...
    ([AGENT_MAIN, "train.py", "--lr", "3e-4"], [PY, "-u", "-m", "pgdash_agent", "train.py", "--lr",
                                                "3e-4"], "train.py", "train.py --lr 3e-4"),
    # ... or after it (attached at init_process_group): the interpreter's argv still says it
    (["/w/train.py", "--lr", "3e-4"], [PY, "-m", "pgdash_agent", "train.py", "--lr", "3e-4"],
     "train.py", "train.py --lr 3e-4"),
    # pgdash's launcher by path, and by its other name
    ([AGENT_MAIN, "t.py"], [PY, AGENT_MAIN, "t.py"], "t.py", "t.py"),
    (["/w/t.py"], [PY, "-m", "pgdash_agent", "t.py", "x y"], "t.py", "t.py 'x y'"),
    # modules: under the launcher, and plain (sys.argv[0] is then the module's file)
    (["/w/pkg/train.py", "x"], [PY, "-m", "pgdash_agent", "-m", "pkg.train", "x"], "pkg.train",
     "-m pkg.train x"),
    (["/w/pkg/train.py"], [PY, "-X", "dev", "-W", "ignore", "-Bmpkg.train"], "pkg.train",
     "-m pkg.train"),
    # a process multiprocessing's spawn started: -c there, its parent's sys.argv restored
    (["/w/spawn_ddp.py", "2"], [PY, "-c", "from multiprocessing.spawn import spawn_main; "
                                "spawn_main()", "--multiprocessing-fork"], "spawn_ddp.py",
     "/w/spawn_ddp.py 2"),
    # -c code and the REPL run no program
    (["-c"], [PY, "-c", "pass"], None, None),
    ([""], [PY], None, None),
])
def test_the_program_is_the_users_not_pgdashs_launcher(argv, orig_argv, program, command):
    launch = identity.launch_of({}, argv, orig_argv, spawned=False)
    assert (launch.program, launch.command) == (program, command)


@pytest.mark.parametrize("env, spawned, launcher, launcher_id", [
    ({"TORCHELASTIC_RUN_ID": RUN_ID, "SLURM_JOB_ID": "7", "SLURM_PROCID": "0"}, False,
     "torchrun", "6fd5bf1d"),
    ({"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "h", "MASTER_PORT": "2"}, False,
     "torchrun", "h:2"),
    ({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1"}, False, "slurm",
     "slurm-7.0"),
    # a process that a SLURM task spawned is no task, but the launch is the same step
    ({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1"}, True, "mp.spawn",
     "slurm-7.0"),
    ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "12355"}, True, "mp.spawn",
     "127.0.0.1:12355"),
    ({}, False, "python", None),
])
def test_the_launcher_and_its_id(env, spawned, launcher, launcher_id):
    launch = identity.launch_of(env, *TRAIN, spawned=spawned)
    assert (launch.launcher, launch.launcher_id) == (launcher, launcher_id)


def test_the_command_line_never_carries_a_secret():
    env = {"PGDASH_TOKEN": "s3cr3t-value"}
    args = ["--token", "abc", "--api-key=def", "wandb.api_key=ghi", "--data",
            "http://me:pw@host/x", "--note", "s3cr3t-value", "--lr", "3"]
    launch = identity.launch_of(env, ["t.py"], [PY, "t.py", *args], spawned=False)
    assert launch.command == ("t.py --token REDACTED --api-key=REDACTED "
                              "wandb.api_key=REDACTED --data http://REDACTED@host/x "
                              "--note REDACTED --lr 3")


def test_a_name_and_a_command_stay_within_the_wire_limits():
    script = "x" * 400 + ".py"
    launch = identity.launch_of({"TORCHELASTIC_RUN_ID": "r" * 300}, [script],
                                [PY, script, *["--arg"] * 300], spawned=False)
    assert len(launch.job_name()) <= MAX_NAME and len(launch.command) == MAX_COMMAND
    body = decode_v2(encode_v2(identity.hello(launch.job_name(), {}, launch)))  # as sent
    stored = validate_event({"seq": 1, "t": 1.0, "kind": "hello", "body": body})["body"]
    assert (stored["command"], stored["launcher"], stored["launcher_id"]) == (
        launch.command, "torchrun", launch.launcher_id)


def test_a_job_says_how_it_was_launched_as_its_rank_0_said_it():
    launch = {"command": "train.py --lr 3e-4", "launcher": "torchrun",
              "launcher_id": "6fd5bf1d"}

    def launched(state):
        s = state.summary()
        return {k: s[k] for k in ("command", "launcher", "launcher_id", "attempt")}

    log = Log().add("s1", "hello", dict(hello(1), command="rank 1's", launcher="torchrun",
                                        launcher_id="6fd5bf1d"), 1.0)
    assert launched(log.state())["command"] == "rank 1's"  # the only one so far
    log.add("s0", "hello", dict(hello(0), **launch), 2.0)
    assert launched(log.state()) == {**launch, "attempt": 0}
    # torchrun restarts the job: the new attempt's rank 0 says it again
    log.add("s2", "hello", dict(hello(0), **launch, attempt=1), 3.0)
    assert launched(log.state()) == {**launch, "attempt": 1}
    # an older agent's hello says nothing of it
    old = Log().add("s0", "hello", hello(0), 1.0).state()
    assert launched(old) == {"command": None, "launcher": None, "launcher_id": None,
                             "attempt": 0}


def test_job_name_from_init_method():
    assert identity.job_from_init_method("tcp://10.0.0.1:23456") == "10.0.0.1:23456"
    assert identity.job_from_init_method("file:///tmp/rdzv") == "file:///tmp/rdzv"
    assert identity.job_from_init_method("env://") is None
    assert identity.job_from_init_method(None) is None


def test_rank_from_torchrun_wins_over_slurm():
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "SLURM_PROCID": "0",
           "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"}
    assert identity.launch_rank(env) == (5, 8, 1)


def test_rank_from_slurm_only_in_the_task_itself():
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
           "SLURM_TASK_PID": str(os.getpid())}
    assert identity.launch_rank(env) == (3, 4, 1)
    hello_body = identity.hello("j", env)
    assert (hello_body["rank"], hello_body["world_size"], hello_body["local_rank"]) == (3, 4, 1)
    # a process the task started (torch.multiprocessing.spawn) inherits them: not that rank
    child = dict(env, SLURM_TASK_PID=str(os.getpid() + 1))
    assert identity.launch_rank(child)[0] is None


@pytest.mark.parametrize("env, attempt", [
    ({}, 0), ({"TORCHELASTIC_RESTART_COUNT": "2"}, 2), ({"SLURM_RESTART_COUNT": "1"}, 1),
    ({"TORCHELASTIC_RESTART_COUNT": "bad"}, 0),
])
def test_attempt_of_a_process(env, attempt):
    assert identity.attempt(env) == attempt
    assert identity.hello("j", env)["attempt"] == attempt


def test_attempt_is_optional_on_the_wire():
    auth = {"v": PROTOCOL_VERSION, "session": "s", "job": "j", "rank": 0}
    assert validate_auth(dict(auth)) and validate_auth(dict(auth, attempt=1))
    with pytest.raises(WireError, match=r"auth.attempt: Expected `int \| null`, got `str`"):
        validate_auth(dict(auth, attempt="1"))
    body = {"job": "j", "host": "h", "pid": 1}
    validate_event({"seq": 1, "t": 1.0, "kind": "hello", "body": body})  # an older agent
    with pytest.raises(WireError, match="command: Expected `str` of length <= 512"):
        validate_event({"seq": 1, "t": 1.0, "kind": "hello",
                        "body": dict(body, command="x" * 513)})
    with pytest.raises(WireError, match="attempt"):
        validate_event({"seq": 1, "t": 1.0, "kind": "hello", "body": dict(body, attempt=-1)})


def restarted(world=2):
    """Attempt 0: rank 1 raises while rank 0 waits in all_reduce #3; torchrun stops rank 0
    (no clean exit). Attempt 1: both ranks start again at t=40 and run."""
    log = Log()
    for r in range(world):
        log.add(f"a{r}", "connect", {"rank": r, "host": "h", "attempt": 0}, t=10)
        log.add(f"a{r}", "hello", dict(hello(r, world), attempt=0), t=10)
        log.add(f"a{r}", "init_done", {"rank": r, "world_size": world, "backend": "gloo",
                                       "duration_s": 0.1}, t=10)
        log.add(f"a{r}", "group", {"name": "0", "ranks": list(range(world))}, t=10)
    log.add("a0", "heartbeat", {"groups": [{"group": "0", "entered": 3, "completed": 2,
                                            "inflight_op": "all_reduce",
                                            "inflight_since": 20.0}]}, t=21)
    log.add("a1", "error", {"where": "uncaught", "error_type": "RuntimeError",
                            "error": "boom in attempt 0"}, t=20)
    log.add("a1", "exit", {"clean": False}, t=20.5)
    log.add("a0", "disconnect", {}, t=30)
    for r in range(world):
        log.add(f"b{r}", "connect", {"rank": r, "host": "h", "attempt": 1}, t=40)
        log.add(f"b{r}", "hello", dict(hello(r, world), attempt=1), t=40)
        log.add(f"b{r}", "init_done", {"rank": r, "world_size": world, "backend": "gloo",
                                       "duration_s": 0.1}, t=41)
        log.add(f"b{r}", "heartbeat", {"groups": [{"group": "0", "entered": 1,
                                                   "completed": 1}]}, t=42)
    return log


def test_findings_of_attempt_0_while_it_runs():
    log = restarted()
    attempt0 = Log()
    attempt0.events = [e for e in log.events if e["t"] <= 30]
    found = diagnose(attempt0.state(), 35.0, S)
    # rank 0, stopped by torchrun after rank 1's crash, is its consequence: no finding of its own
    assert {(f["kind"], tuple(f["ranks"]), f["attempt"]) for f in found} == {
        ("rank_failed", (1,), 0)}
    assert all("@" not in f["id"] for f in found)  # attempt 0 keeps the ids it always had


def test_a_new_attempt_is_diagnosed_on_its_own_ranks():
    state = restarted().state()
    assert state.attempt == 1 and state.status == "running"
    assert [(r.rank, r.attempt, r.status) for r in state.ranks()] == [
        (0, 1, "running"), (1, 1, "running")]
    # rank 0's all_reduce of attempt 0 has "waited" 32 s and attempt 0's ranks failed or
    # vanished: none of it is held against attempt 1
    assert diagnose(state, 52.0, S) == []
    # and attempt 1's own trouble is found, under its own ids
    log = restarted()
    log.add("b1", "error", {"where": "uncaught", "error_type": "ValueError",
                            "error": "boom in attempt 1"}, t=50)
    log.add("b1", "exit", {"clean": False}, t=50)
    found = diagnose(log.state(), 52.0, S)
    assert [(f["kind"], f["ranks"], f["attempt"], f["id"]) for f in found] == [
        ("rank_failed", [1], 1, "rank_failed:-:r1@1")]
    assert found[0]["evidence"]["error"] == "boom in attempt 1"


def test_attempt_rows():
    log = restarted()
    for r in range(2):
        log.add(f"b{r}", "exit", {"clean": True}, t=50 + r)
    state = log.state()
    assert state.status == "finished" and state.ended_at == 51
    rows = state.attempt_rows()
    assert [(a["attempt"], a["status"], a["started_at"], a["ended_at"]) for a in rows] == [
        (0, "failed", 10, 30), (1, "finished", 40, 51)]
    assert [(r["rank"], r["status"]) for r in rows[0]["ranks"]] == [(0, "lost"), (1, "failed")]
    assert views.detail(state)["attempts"] == rows
    assert [e["attempt"] for e in views.error_rows(state)] == [0]


def test_an_attempt_cut_short_by_the_restart_ends_when_the_next_starts():
    log = Log()
    log.add("a0", "connect", {"rank": 0, "attempt": 0}, t=10)
    log.add("a0", "hello", dict(hello(0, 1), attempt=0), t=10)
    log.add("b0", "connect", {"rank": 0, "attempt": 1}, t=40)  # a0 never said goodbye
    rows = log.state().attempt_rows()
    assert [(a["attempt"], a["status"], a["ended_at"]) for a in rows] == [
        (0, "failed", 40), (1, "initializing", None)]


@pytest.fixture
def ingest(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}").start()
    clock = iter(range(1000, 100000)).__next__
    yield Ingest(store, token=None, clock=lambda: float(clock())).start()
    store.close()


def auth(session, rank, attempt=None):
    found = {"v": PROTOCOL_VERSION, "session": session, "job": "j", "rank": rank,
             "host": "h", "pid": 1}
    return found if attempt is None else dict(found, attempt=attempt)


def test_a_later_attempt_joins_the_job_and_a_new_launch_does_not(ingest):
    _, job = ingest.connect(auth("a0", 0, attempt=0))
    _, same = ingest.connect(auth("a1", 1))  # an older agent: attempt 0
    assert same == job
    _, restarted_job = ingest.connect(auth("b0", 0, attempt=1))
    assert restarted_job == job, "torchrun's restart is the next attempt of the same job"
    _, job_b1 = ingest.connect(auth("b1", 1, attempt=1))
    assert job_b1 == job
    assert ingest.read(job, lambda s: s.attempt) == 1
    _, again = ingest.connect(auth("c0", 0, attempt=1))
    assert again != job, "rank 0 of attempt 1 is taken: a new launch under the same name"
    _, fresh = ingest.connect(auth("d0", 0, attempt=0))
    assert fresh not in (job, again), "a first attempt after a restarted one is a new launch"
