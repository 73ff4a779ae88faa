"""The agent's collective wrappers' pure parts: a rooted collective's root as a global rank
(the wrapped calls themselves run in real gloo jobs: tests/integration/test_corpus.py's
broadcast_src_mismatch)."""

import inspect

import torch.distributed as dist

from pgdash_agent.collective_wrappers import ROOTS, _root
from pgdash_agent.collectives import GroupTrack


def root_of(op, *args, **kwargs):
    params = list(inspect.signature(getattr(dist, op)).parameters)
    name, gname = ROOTS[op]
    track = GroupTrack("1", None, "gloo", ranks=[4, 6, 7])  # global ranks of group ranks 0-2
    return _root(track, args, kwargs, params.index(name) if name in params else None, name,
                 params.index(gname) if gname in params else None, gname)


def test_a_root_is_the_global_rank_given_or_the_group_rank_translated():
    assert root_of("broadcast", "tensor", 6) == 6  # src, by position
    assert root_of("broadcast", "tensor", src=7) == 7
    assert root_of("broadcast", "tensor", group_src=1) == 6  # group rank 1 is global 6
    assert root_of("reduce", "tensor", dst=4) == 4
    assert root_of("gather", "tensor", group_dst=2) == 7
    assert root_of("scatter", "tensor", None, 4) == 4


def test_no_root_or_a_negative_one_reports_none():
    assert root_of("broadcast", "tensor") is None
    assert root_of("broadcast", "tensor", src=-1) is None
    assert root_of("broadcast", "tensor", group_src=9) == 9  # outside the group: as given


FINGERPRINTS = """
import os, sys, torch, torch.distributed as dist
from pgdash_agent.collectives import CollectiveTracker
from pgdash_agent.collective_wrappers import CollectiveWrappers
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0,
                        world_size=1)
tracker = CollectiveTracker(lambda pg: ("0", None, "gloo", [0]), lambda *a: None, 1024)
CollectiveWrappers(tracker).install([dist, dist.distributed_c10d])
odd = sys.argv[2]
for i in range(1, 257):
    t = torch.ones(8)
    if i == 5:  # an all_gather: its size may differ by rank
        n = 9 if odd == "gather" else 8
        dist.all_gather([torch.empty(n)], torch.ones(n))
    elif i == 6 and odd == "max":
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    elif i == 6 and odd == "dtype":
        dist.all_reduce(t.double())
    elif i == 6 and odd == "size":
        dist.all_reduce(torch.ones(9))
    else:
        dist.all_reduce(t, dist.ReduceOp.SUM if i % 2 else dist.ReduceOp(dist.ReduceOp.SUM))
print(tracker.by_name["0"].fp_marks, flush=True)
os._exit(0)  # (gloo's teardown at exit aborts now and then: nothing here depends on it)
"""


def test_call_fingerprints_agree_across_processes_and_differ_with_an_argument(tmp_path):
    """A real gloo group of one, in fresh interpreters with different string-hash seeds: the
    same calls give the same marks at #256, whichever way the reduce op is written;
    another reduce op, dtype or all_reduce size in call #6 changes them; an all_gather's
    size (which ranks may differ in) does not."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.helpers.procs import free_port

    script = tmp_path / "fp.py"
    script.write_text(FINGERPRINTS)

    def marks(odd, seed):
        env = dict(os.environ, PYTHONHASHSEED=str(seed))
        out = subprocess.run([sys.executable, str(script), str(free_port()), odd], env=env,
                             capture_output=True, text=True, timeout=120,
                             cwd=str(Path(__file__).parents[2]))
        assert out.returncode == 0, out.stderr
        return out.stdout.strip().splitlines()[-1]

    same = marks("none", 1)
    assert same.startswith("[(256, ") and same.endswith("None]")  # 256 is a 16-mark too
    assert marks("none", 2) == same
    assert marks("gather", 3) == same
    for odd in ("max", "dtype", "size"):
        assert marks(odd, 4) != same, odd


def test_a_failure_reports_the_last_collective_of_each_group_with_the_sizes_ranks_share():
    """What an uncaught error carries (pgdash_agent.failures): the last two collectives of
    each group, the newest group first, bytes 0 for an op whose size may differ by rank."""
    import torch

    from pgdash_agent.collectives import CollectiveTracker

    names = iter(["0", "1"])
    tracker = CollectiveTracker(lambda pg: (next(names), None, "gloo", [0, 1]),
                                lambda *a: None, 16)
    world, sub = tracker.track_for(object()), tracker.track_for(object())
    world.completed, world.done, world.inflight_since = 106, ("broadcast", torch.uint8, 91,
                                                              0), 2.0
    world.before = (105, ("broadcast", torch.int64, 16, 0))
    sub.completed, sub.done, sub.inflight_since = 7, ("all_gather", torch.float32, 36,
                                                       None), 1.0
    assert tracker.last_calls() == [["0", 106, "broadcast", "uint8", 91],
                                    ["0", 105, "broadcast", "int64", 16],
                                    ["1", 7, "all_gather", "float32", 0]]


OVERLAP = """
import os, sys, time, torch, torch.distributed as dist
from pgdash_agent.collectives import CollectiveTracker
from pgdash_agent.collective_wrappers import CollectiveWrappers
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0,
                        world_size=1)
tracker = CollectiveTracker(lambda pg: ("0", None, "gloo", [0]), lambda *a: None, 1024)
wrappers = CollectiveWrappers(tracker)
wrappers.install([dist, dist.distributed_c10d])
wrappers.install_wait(dist.Work)
work = dist.all_reduce(torch.ones(8), async_op=True)  # issued, then 0.3 s of compute
time.sleep(0.3)
tracker.poll_async()  # the agent's thread sees it complete
work.wait()
late = dist.all_reduce(torch.ones(8), async_op=True)
late.wait()  # waited at once
time.sleep(0.3)
tracker.poll_async()
hooked = dist.all_reduce(torch.ones(8), async_op=True)
hooked.get_future()  # DDP's comm hook: waited on in C++, timed from issue
time.sleep(0.3)
tracker.poll_async()
print([round(t1 - t0, 3) for (_, _, _, t0, t1, _, _) in tracker.records], len(tracker.async_blocked), flush=True)
os._exit(0)
"""


def test_an_overlapped_async_collective_costs_what_it_blocked_not_issue_to_completion(
        tmp_path):
    """An all_reduce with async_op=True, computed over for 0.3 s before its wait(): the
    rank waited for nothing (the straggler rule read 0.3 s as a wait: healthy ranks named;
    bench/corpus/healthy_async_allreduce_overlap.py). One whose future was taken (DDP's comm
    hook: the reducer waits in C++) keeps its time from issue to completion (without it,
    ddp_straggler_input's straggler went unseen). A real gloo group of one."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.helpers.procs import free_port

    script = tmp_path / "overlap.py"
    script.write_text(OVERLAP)
    out = subprocess.run([sys.executable, str(script), str(free_port())], capture_output=True,
                         text=True, timeout=120, cwd=str(Path(__file__).parents[2]))
    durations, left = out.stdout.strip().splitlines()[-1].rsplit(" ", 1)
    overlapped, waited, hooked = eval(durations)
    assert overlapped < 0.1 and waited < 0.1, out.stdout  # not the 0.3 s of compute
    assert hooked >= 0.25, out.stdout  # its future's waiter is DDP's: issue to completion
    assert left == "0"
