"""DDP, 3 ranks; rank 2 builds its model from a stale config with one more hidden layer, so DDP's construction check fails on every rank, each naming the mismatch in its own words.
EXPECT kind=rank_failed culprit=2 ranks=3 launch=torchrun class=config
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
random.Random(int(os.environ.get("CORPUS_SEED", "0"))).random()
layers = 3 if rank == 2 else 2  # rank 2 read yesterday's config file
if rank == 2:
    fault("builds its model with 3 hidden layers where the others have 2")
model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(layers)])
ddp = DDP(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
for step in range(400):
    loss = ddp(torch.randn(8, 32)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.015)
dist.destroy_process_group()
