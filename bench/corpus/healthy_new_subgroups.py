"""4 ranks under torchrun; the job splits into two halves with dist.new_subgroups(group_size=2) (every rank calls it; torch makes both groups on every rank) and each step all-reduces within its half, then across the job every 10 steps. Nothing is wrong.
EXPECT kind=none ranks=4 launch=torchrun class=healthy
"""
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
half, _ = dist.new_subgroups(group_size=2)
print(f"MARK {time.time():.6f}", flush=True)
g = torch.zeros(1024)
for step in range(300):
    g.normal_()
    dist.all_reduce(g, group=half)
    if step % 10 == 9:
        dist.all_reduce(g)
    time.sleep(0.015)
dist.destroy_process_group()
