"""DDP, 4 ranks; the first 3 steps are slow and uneven (1-4 s per rank per step: compilation, cache warm-up), then steady steps.
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
rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")) * 17 + rank)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

for step in range(400):
    if step < 3:
        time.sleep(rng.uniform(1, 4))  # "compiling" on the first steps
    time.sleep(0.01)
    model(torch.randn(16, 32)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
