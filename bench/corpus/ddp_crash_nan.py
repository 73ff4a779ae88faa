"""DDP, 4 ranks; rank 2's loss becomes NaN and its own check raises FloatingPointError.
EXPECT kind=rank_failed culprit=2 ranks=4 launch=torchrun class=crash
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

BAD = 2


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
bad_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

for step in range(bad_step + 400):
    x = torch.randn(16, 32)
    time.sleep(0.01)
    if rank == BAD and step == bad_step:
        fault("its loss becomes NaN; its check raises FloatingPointError")
        x[0, 0] = float("nan")
    loss = model(x).pow(2).mean()
    if not torch.isfinite(loss):
        raise FloatingPointError(f"loss is {loss.item()} at step {step}")
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
