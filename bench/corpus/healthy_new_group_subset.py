"""Plain all_reduce training, 4 ranks under torchrun; every rank calls dist.new_group([0, 1]) once at the start, as new_group requires, but only ranks 0 and 1 use it (an all_reduce of an eval metric every 20 steps, with a 0.3 s eval on those two ranks), while ranks 2 and 3 wait at the next all_reduce of the whole job. Nothing is wrong.
EXPECT kind=none ranks=4 launch=torchrun class=healthy
"""
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
evalers = dist.new_group([0, 1])
print(f"MARK {time.time():.6f}", flush=True)
t = torch.ones(1024)
for step in range(300):
    dist.all_reduce(t)
    t /= dist.get_world_size()
    if step % 20 == 19 and rank in (0, 1):
        time.sleep(0.3)  # evaluate a held-out shard
        metric = torch.ones(1)
        dist.all_reduce(metric, group=evalers)
    time.sleep(0.015)
dist.destroy_process_group()
