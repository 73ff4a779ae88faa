"""FSDP2 (fully_shard), 4 ranks; from a random step on, rank 3 is 60 ms late at every step (its data augmentation).
EXPECT kind=straggler culprit=3 ranks=4 launch=torchrun class=straggler
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

SLOW, SLOW_STEPS = 3, 150


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
slow_from = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(50, 120)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)

for step in range(slow_from + SLOW_STEPS):
    if rank == SLOW and step >= slow_from:
        if step == slow_from:
            fault("data augmentation 60 ms late at every step from now on")
        time.sleep(0.06)
    model(torch.randn(8, 16)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    if rank == SLOW and step >= slow_from:
        print(f"STEP {step - slow_from + 1} {time.time():.6f}", flush=True)
dist.destroy_process_group()
