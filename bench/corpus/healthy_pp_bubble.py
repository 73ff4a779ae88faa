"""torch.distributed.pipelining ScheduleGPipe, 4 stages, healthy: the pipeline's bubble makes every stage wait for its neighbours at every step.
EXPECT kind=none ranks=4 launch=agent class=healthy
"""
import time

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)

    def forward(self, x):
        time.sleep(0.003)  # the stage's compute
        return torch.relu(self.lin(x))


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
stage = PipelineStage(Block(), rank, world, torch.device("cpu"))
schedule = ScheduleGPipe(stage, n_microbatches=4,
                         loss_fn=lambda out, target: (out - target).pow(2).mean())
opt = torch.optim.SGD(stage.submod.parameters(), lr=0.01)

for step in range(300):
    x, target = torch.randn(16, 32), torch.randn(16, 32)
    if rank == 0:
        schedule.step(x)
    elif rank == world - 1:
        schedule.step(target=target, losses=[])
    else:
        schedule.step()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
