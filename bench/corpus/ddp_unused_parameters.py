"""DDP, 3 ranks; from one step on, rank 2 takes a branch of the model that skips a layer, so that layer's gradients never arrive from it and DDP raises on its next iteration ("Expected to have finished reduction in the prior iteration").
EXPECT kind=rank_failed culprit=2 ranks=3 launch=agent class=crash
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ODD = 2


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(32, 32)
        self.b = torch.nn.Linear(32, 32)
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x, skip_b=False):
        x = torch.relu(self.a(x))
        if not skip_b:
            x = torch.relu(self.b(x))
        return self.head(x)


dist.init_process_group("gloo")
rank = dist.get_rank()
odd_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
model = DDP(Net())
opt = torch.optim.SGD(model.parameters(), lr=0.01)

for step in range(odd_at + 400):
    skip = rank == ODD and step >= odd_at
    if rank == ODD and step == odd_at:
        fault("skips layer b from this step on (its gradients never come)")
    loss = model(torch.randn(8, 32), skip_b=skip).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.015)
dist.destroy_process_group()
