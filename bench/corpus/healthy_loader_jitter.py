"""Plain all_reduce training, 4 ranks; data-loader jitter of 0-40 ms per step on every rank, with an occasional 300 ms hiccup.
EXPECT kind=none ranks=4 launch=agent class=healthy
"""
import os
import random
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")) * 31 + rank)
w = torch.zeros(1024)

for step in range(500):
    time.sleep(rng.uniform(0, 0.04) + (0.3 if rng.random() < 0.01 else 0.0))
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.001 * grad / world
dist.destroy_process_group()
