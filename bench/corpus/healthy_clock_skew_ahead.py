"""Plain all_reduce training, 3 ranks under the agent; rank 0 runs on a host whose wall clock is 40 s ahead of the others' (no NTP on that node; its monotonic clock is fine). Nothing is wrong with the job.
EXPECT kind=none ranks=3 launch=agent class=healthy
"""
import os
import time

if os.environ.get("RANK") == "0":  # this node's wall clock is 40 s ahead
    _wall = time.time
    time.time = lambda: _wall() + 40.0
    _wall_ns = time.time_ns
    time.time_ns = lambda: _wall_ns() + 40_000_000_000

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
rank = dist.get_rank()
w = torch.zeros(1024)
for step in range(1500):
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
    if step % 300 == 299 and rank == 0:
        print(f"step {step}", flush=True)
dist.destroy_process_group()
