"""Tensor-parallel style training, 3 ranks under torchrun: each step's forward sums the ranks' partial activations with torch.distributed.nn.functional.all_reduce (whose backward all-reduces the gradient), and every rank calls loss.backward(); rank 1 skips backward on one step whose loss it finds to be NaN (a guard only it trips, on its own shard), so it makes one all_reduce fewer than the others from then on: the job's collectives silently pair across steps, and at the end ranks 0 and 2 wait in an all_reduce rank 1 never makes.
EXPECT kind=desync|hang|stall|rank_lost culprit=1 ranks=3 launch=torchrun class=desync
"""
import os
import random
import time

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dfn

SKIPPER = 1


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
bad_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
torch.manual_seed(rank)
w = torch.randn(256, 256, requires_grad=True)
opt = torch.optim.SGD([w], lr=1e-4)
for step in range(bad_step + 300):
    x = torch.randn(32, 256)
    partial = x @ w
    full = dfn.all_reduce(partial)  # backward: an all_reduce of the gradient
    loss = full.pow(2).mean()
    if rank == SKIPPER and step == bad_step:
        fault("finds its loss NaN and skips backward and the step")
        opt.zero_grad()
        continue
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.01)
dist.barrier()
dist.destroy_process_group()
