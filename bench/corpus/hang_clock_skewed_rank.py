"""Plain all_reduce training, 3 ranks under the agent; rank 1 runs on a host whose wall clock is 30 s ahead (no NTP), and after a while it blocks forever reading a shard from a dead mount (a sleep that never returns), while the others wait for it in all_reduce.
EXPECT kind=hang culprit=1 ranks=3 launch=agent class=hang
"""
import os
import random
import time

if os.environ.get("RANK") == "1":  # this node's wall clock is 30 s ahead
    _wall = time.time
    time.time = lambda: _wall() + 30.0
    _wall_ns = time.time_ns
    time.time_ns = lambda: _wall_ns() + 30_000_000_000

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


SKEW = 30.0 if os.environ.get("RANK") == "1" else 0.0


def fault(what):  # (the bench compares with its own clock: the true time, not this host's)
    print(f"FAULT {time.time() - SKEW:.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
stuck_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.zeros(1024)
for step in range(stuck_at + 400):
    if rank == 1 and step == stuck_at:
        fault("blocks reading a shard from a dead mount")
        while True:
            time.sleep(1.0)
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
