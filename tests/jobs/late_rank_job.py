"""A gloo job whose last rank enters one all_reduce late (argv[1] seconds), then all finish.

Used by tests/test_trace.py: a hang that resolves, so the wait has a known start and end. The
late rank prints "LATE <unix time>" when it starts sleeping.
"""

import sys
import time

import torch
import torch.distributed as dist

from pgdash_agent import attach

late = float(sys.argv[1])
attach()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.ones(4)
for _ in range(5):
    dist.all_reduce(t)
    time.sleep(0.05)
if rank == world - 1:
    print(f"LATE {time.time():.6f}", flush=True)
    time.sleep(late)
dist.all_reduce(t)
for _ in range(3):
    dist.all_reduce(t)
    time.sleep(0.05)
dist.destroy_process_group()
