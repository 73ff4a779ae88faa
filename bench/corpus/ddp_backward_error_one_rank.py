"""DDP, 3 ranks, with a custom autograd function in the model; on rank 2 its backward raises once (a shape bug on a rare input), so rank 2 fails inside loss.backward() while the others wait in DDP's gradient all-reduce.
EXPECT kind=rank_failed culprit=2 ranks=3 launch=torchrun class=crash
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


class ClipGrad(torch.autograd.Function):
    rare = False

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        if ClipGrad.rare:
            return grad.view(-1, 3)  # wrong shape: autograd refuses it
        return grad.clamp(-1, 1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.b(ClipGrad.apply(self.a(x)))


dist.init_process_group("gloo")
rank = dist.get_rank()
bad_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
model = DDP(Net())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(bad_step + 300):
    if rank == 2 and step == bad_step:
        fault("its custom backward returns a gradient of the wrong shape")
        ClipGrad.rare = True
    model(torch.randn(6, 32)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.015)
dist.destroy_process_group()
