"""Three-stage pipeline with isend/irecv + wait; stage 1 freezes in its backward compute.
EXPECT kind=hang culprit=1 ranks=3 launch=agent class=p2p
"""
import os
import random
import time

import torch
import torch.distributed as dist

FROZEN = 1


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
freeze_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
layer = torch.nn.Linear(32, 32)
opt = torch.optim.Adam(layer.parameters(), lr=1e-3)

for step in range(freeze_step + 400):
    pending = []
    if rank == 0:
        x = torch.randn(16, 32)
    else:
        x = torch.empty(16, 32)
        dist.irecv(x, src=rank - 1).wait()
        x.requires_grad_()
    y = torch.tanh(layer(x))
    if rank < world - 1:
        pending.append(dist.isend(y.detach(), dst=rank + 1))
    time.sleep(0.005)
    if rank == world - 1:
        y.pow(2).mean().backward()
    else:
        grad = torch.empty_like(y)
        dist.irecv(grad, src=rank + 1).wait()
        if rank == FROZEN and step == freeze_step:
            fault("stage freezes in its backward compute")
            while True:
                time.sleep(1)
        y.backward(grad)
    if rank > 0:
        pending.append(dist.isend(x.grad.contiguous(), dst=rank - 1))
    for work in pending:
        work.wait()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
