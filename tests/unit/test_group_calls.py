"""The agent counts each new_group call before it is made (pgdash_agent.process_groups), on
a real one-rank gloo world in a process of its own (torch's registry is process-wide): the
call that raises or hangs is counted too, calls only members make
(``use_local_synchronization=True``) are not, ``ranks=None`` is the world, the ranks' order
does not matter where torch sorts them, and a world made again counts afresh."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers.procs import ROOT

PROBE = """
import json, socket
import torch.distributed as dist
from torch.distributed import distributed_c10d
from pgdash_agent.collectives import CollectiveTracker
from pgdash_agent.outbox import Outbox
from pgdash_agent.process_groups import ProcessGroupWatch, describe_group

tracker = CollectiveTracker(describe_group, lambda *a: None, 1000)
watch = ProcessGroupWatch(Outbox(100), tracker, {}, lambda: None, lambda: None)
watch.install(dist, distributed_c10d)
seen = {}

def world():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)

world()
seen["start"] = tracker.groups_made[0]
dist.new_group([0])
seen["one"] = list(tracker.groups_made[1])
dist.new_group()  # the world: the same ranks as [0]
dist.new_group([0], use_local_synchronization=True)  # only members call it: not counted
seen["same"] = list(tracker.groups_made[1])
try:
    dist.new_group([0, 5])  # rank 5 is not in this world: raises, counted before
except Exception as exc:
    seen["raised"] = type(exc).__name__
seen["made"] = tracker.groups_made[0]
seen["kept"] = len(tracker.groups_made[1])
dist.destroy_process_group()
world()
seen["again"] = [tracker.groups_made[0], list(tracker.groups_made[1])]
dist.new_group([0])
seen["again_one"] = list(tracker.groups_made[1])
dist.destroy_process_group()
watch.uninstall()
seen["errors"] = tracker.internal_errors
print(json.dumps(seen))
"""


def test_new_group_calls_are_counted_before_they_are_made():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["start"] == 0 and seen["raised"] and seen["errors"] == 0
    assert seen["made"] == 3 and seen["kept"] == 3
    first, second = seen["same"]
    assert seen["one"] == [first] and second != first  # a fingerprint of all calls so far
    assert seen["again"] == [0, []] and seen["again_one"] == [first]  # afresh, the same
