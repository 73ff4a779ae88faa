"""torch.distributed.pipelining ScheduleInterleaved1F1B, 4 ranks x 2 virtual stages; rank 3 freezes in the forward of its last stage.
EXPECT kind=hang culprit=3 ranks=4 launch=agent class=p2p
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B

FROZEN = 3
freeze = {"now": False}


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


class Block(torch.nn.Module):
    def __init__(self, may_freeze):
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)
        self.may_freeze = may_freeze

    def forward(self, x):
        if self.may_freeze and freeze["now"]:
            fault("rank freezes in the forward of its last virtual stage")
            while True:
                time.sleep(1)
        return torch.relu(self.lin(x))


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
freeze_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(25, 70)
blocks = [Block(may_freeze=(rank == FROZEN and chunk == 1)) for chunk in range(2)]
stages = [PipelineStage(b, rank + world * chunk, 2 * world, torch.device("cpu"))
          for chunk, b in enumerate(blocks)]
schedule = ScheduleInterleaved1F1B(stages, n_microbatches=2 * world,
                                   loss_fn=lambda out, target: (out - target).pow(2).mean())
opt = torch.optim.SGD([p for b in blocks for p in b.parameters()], lr=0.01)

for step in range(freeze_step + 200):
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
