"""DDP, 3 ranks under torchrun, gradient accumulation over 4 micro-batches with model.no_sync() for the first 3 (one gradient all-reduce every 4 forward/backward passes), a loss all_reduce per optimizer step for logging, and a checkpoint by rank 0 every 100 steps. Nothing is wrong.
EXPECT kind=none ranks=3 launch=torchrun class=healthy
"""
import contextlib
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ACCUM = 4
for step in range(350):
    opt.zero_grad()
    total = torch.zeros(1)
    for micro in range(ACCUM):
        ctx = model.no_sync() if micro < ACCUM - 1 else contextlib.nullcontext()
        with ctx:
            x = torch.randn(32, 64)
            loss = model(x).pow(2).mean() / ACCUM
            loss.backward()
        total += loss.detach()
    opt.step()
    dist.all_reduce(total)
    if rank == 0 and step % 100 == 99:
        torch.save(model.state_dict(), os.devnull)
    time.sleep(0.02)
dist.destroy_process_group()
