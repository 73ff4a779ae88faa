"""torch.distributed.pipelining ScheduleGPipe, 3 stages started by hand; stage 1's forward raises (an index out of range in its embedding lookup), so stage 0 waits to send and stage 2 to receive.
EXPECT kind=rank_failed culprit=1 ranks=3 launch=agent class=crash
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

BAD = 1
broken = {"now": False}


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)
        self.table = torch.nn.Parameter(torch.randn(8, 32))

    def forward(self, x):
        if broken["now"]:
            broken["now"] = False
            fault("an index out of range in the stage's lookup")
            x = x + self.table[torch.tensor([9])]
        return torch.relu(self.lin(x))


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
bad_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(40, 120)
stage = PipelineStage(Block(), rank, world, torch.device("cpu"))
schedule = ScheduleGPipe(stage, n_microbatches=4,
                         loss_fn=lambda out, target: (out - target).pow(2).mean())
opt = torch.optim.SGD(stage.submod.parameters(), lr=0.01)

for step in range(bad_step + 300):
    x, target = torch.randn(16, 32), torch.randn(16, 32)
    if rank == BAD and step == bad_step:
        broken["now"] = True
    if rank == 0:
        schedule.step(x)
    elif rank == world - 1:
        schedule.step(target=target, losses=[])
    else:
        schedule.step()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
