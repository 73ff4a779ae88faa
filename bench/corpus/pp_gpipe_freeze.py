"""torch.distributed.pipelining ScheduleGPipe, 4 stages; stage 2 freezes in its forward compute.
EXPECT kind=hang culprit=2 ranks=4 launch=agent class=p2p
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

FROZEN = 2
freeze = {"now": False}


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)

    def forward(self, x):
        if freeze["now"]:
            fault("stage freezes in its forward compute")
            while True:
                time.sleep(1)
        return torch.relu(self.lin(x))


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
freeze_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(40, 120)
stage = PipelineStage(Block(), rank, world, torch.device("cpu"))
schedule = ScheduleGPipe(stage, n_microbatches=4,
                         loss_fn=lambda out, target: (out - target).pow(2).mean())
opt = torch.optim.SGD(stage.submod.parameters(), lr=0.01)

for step in range(freeze_step + 300):
    x, target = torch.randn(16, 32), torch.randn(16, 32)
    if rank == FROZEN and step == freeze_step:
        freeze["now"] = True
    if rank == 0:
        schedule.step(x)
    elif rank == world - 1:
        schedule.step(target=target, losses=[])
    else:
        schedule.step()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
