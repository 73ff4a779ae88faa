"""FSDP2 (fully_shard), 3 ranks; once, rank 2's loss is NaN (a bad batch) and its loop `continue`s before backward: its next forward all-gathers parameters while the others are inside the step's backward reduce-scatter.
EXPECT kind=desync|hang culprit=2 ranks=3 launch=torchrun class=desync
"""
import math
import os
import random
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
bad_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)

for step in range(bad_step + 300):
    loss = model(torch.randn(8, 16)).pow(2).mean()
    if rank == 2 and step == bad_step:
        loss = loss * float("nan")
    if math.isnan(loss.item()):
        fault("skips backward on a NaN loss")
        opt.zero_grad()
        continue
    loss.backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.01)
dist.destroy_process_group()
