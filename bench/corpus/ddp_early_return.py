"""DDP; rank 1 computes its own max_steps from its shard and returns from train() early, destroys its group and exits 0 while the others keep stepping.
EXPECT kind=rank_exited_early culprit=1 ranks=3 launch=agent class=early_exit
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


def train(model, opt, max_steps, rank):
    for step in range(10_000):
        if step == max_steps:
            if rank == 1:
                fault("reached its own max_steps: returns from train(), destroys its group, "
                      "exits 0")
            return
        x = torch.randn(8, 16)
        time.sleep(0.01)
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


dist.init_process_group("gloo")
rank = dist.get_rank()
rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")))
max_steps = rng.randint(60, 160) if rank == 1 else 100_000  # only rank 1 got a short shard
model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
train(model, opt, min(max_steps, 1000), rank)
dist.destroy_process_group()
