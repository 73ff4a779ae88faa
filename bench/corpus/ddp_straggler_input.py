"""DDP, 4 ranks; from a random step on, rank 2's input pipeline is 60 ms late at every step (a slow disk); no Python collective in the loop.
EXPECT kind=straggler culprit=2 ranks=4 launch=agent class=straggler
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

SLOW, SLOW_STEPS = 2, 150


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
slow_from = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 140)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

for step in range(slow_from + SLOW_STEPS):
    time.sleep(0.01)  # reading the next batch
    if rank == SLOW and step >= slow_from:
        if step == slow_from:
            fault("input pipeline 60 ms late at every step from now on")
        time.sleep(0.06)
    x = torch.randn(16, 32)
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    if rank == SLOW and step >= slow_from:
        print(f"STEP {step - slow_from + 1} {time.time():.6f}", flush=True)
dist.destroy_process_group()
