"""Data parallel, 4 ranks under torchrun; ranks 0 and 1 evaluate, and only they create their evaluation group, with dist.new_group([0, 1], use_local_synchronization=True) (which only its members call), then all-reduce the eval metric on it every 25 steps. Nothing is wrong.
EXPECT kind=none ranks=4 launch=torchrun class=healthy
"""
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
evalers = dist.new_group([0, 1], use_local_synchronization=True) if rank in (0, 1) else None
print(f"MARK {time.time():.6f}", flush=True)
g = torch.zeros(1024)
for step in range(300):
    g.normal_()
    dist.all_reduce(g)
    if evalers is not None and step % 25 == 24:
        time.sleep(0.2)  # evaluate
        metric = torch.ones(1)
        dist.all_reduce(metric, group=evalers)
    time.sleep(0.015)
dist.destroy_process_group()
