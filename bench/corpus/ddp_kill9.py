"""DDP under torchrun, 4 ranks; rank 3 is killed with SIGKILL mid-training.
EXPECT kind=rank_lost culprit=3 ranks=4 launch=torchrun class=lost
"""
import os
import random
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

KILLED = 3


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
kill_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

for step in range(kill_step + 400):
    if rank == KILLED and step == kill_step:
        fault("killed with SIGKILL")
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.01)
    model(torch.randn(16, 32)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
