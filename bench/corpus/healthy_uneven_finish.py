"""Plain all_reduce training, 3 ranks; after the last collective each rank does its own wrap-up (0-4 s), so the ranks finish at different times.
EXPECT kind=none ranks=3 launch=torchrun class=healthy
"""
import os
import random
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")) * 13 + rank)
w = torch.zeros(1024)

for step in range(400):
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.001 * grad / world
    time.sleep(0.015)
dist.destroy_process_group()
time.sleep(rng.uniform(0, 4))  # writing its shard of the outputs, closing its logger
print(f"rank {rank} done", flush=True)
