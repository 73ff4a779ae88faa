"""DDP, 4 ranks, 2 epochs; after each epoch rank 0 alone evaluates (5-8 s) while the others wait at a barrier.
EXPECT kind=none ranks=4 launch=torchrun class=healthy
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")))
steps = rng.randint(100, 180)
eval_s = [rng.uniform(5, 8) for _ in range(2)]
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

for epoch in range(2):
    for step in range(steps):
        time.sleep(0.01)
        model(torch.randn(16, 32)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    if rank == 0:
        with torch.no_grad():  # the evaluation: a held-out set, on rank 0 only
            end = time.time() + eval_s[epoch]
            while time.time() < end:
                model.module(torch.randn(64, 32))
                time.sleep(0.01)
        print(f"epoch {epoch}: evaluated for {eval_s[epoch]:.1f} s", flush=True)
    dist.barrier()
dist.destroy_process_group()
