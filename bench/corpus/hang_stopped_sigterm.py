"""4-rank torchrun DDP job; rank 2's data loader deadlocks (sleeps forever) so the others wait in DDP's all-reduce; 25 s later a scheduler sends SIGTERM to every rank.
EXPECT kind=hang culprit=2 ranks=4 launch=torchrun class=stopped stop_after=25 stop=sigterm
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

STUCK = 2


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


def next_batch(step, rank):
    if rank == STUCK and step == stuck_at:
        fault("its data loader deadlocks: never returns a batch")
        time.sleep(3600)
    time.sleep(0.01)
    return torch.randn(16, 32)


dist.init_process_group("gloo")
rank = dist.get_rank()
stuck_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

for step in range(stuck_at + 500):
    model(next_batch(step, rank)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
