"""Hand-written 4-stage pipeline (GPipe order, blocking send/recv); stage 2 freezes in its forward compute.
EXPECT kind=hang culprit=2 ranks=4 launch=torchrun class=p2p
"""
import os
import random
import time

import torch
import torch.distributed as dist

MICRO, BATCH, WIDTH, FROZEN = 4, 8, 32, 2


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
freeze_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(40, 120)
torch.manual_seed(rank)
stage = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())
opt = torch.optim.SGD(stage.parameters(), lr=0.01)

for step in range(freeze_step + 300):
    inputs, outputs = [], []
    for m in range(MICRO):  # all forwards ...
        if rank == 0:
            x = torch.randn(BATCH, WIDTH)
        else:
            x = torch.empty(BATCH, WIDTH)
            dist.recv(x, src=rank - 1)
            x.requires_grad_()
        if rank == FROZEN and step == freeze_step and m == 1:
            fault("stage freezes in its forward compute")
            while True:
                time.sleep(1)
        y = stage(x)
        time.sleep(0.002)  # the rest of the stage's compute
        if rank < world - 1:
            dist.send(y.detach(), dst=rank + 1)
        inputs.append(x)
        outputs.append(y)
    for m in reversed(range(MICRO)):  # ... then all backwards
        x, y = inputs[m], outputs[m]
        if rank == world - 1:
            y.pow(2).mean().backward()
        else:
            grad = torch.empty_like(y)
            dist.recv(grad, src=rank + 1)
            y.backward(grad)
        if rank > 0:
            dist.send(x.grad, dst=rank - 1)
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
