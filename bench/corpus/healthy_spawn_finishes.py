"""A training script started with torch.multiprocessing.spawn (attach() in each worker after init_process_group): DDP on a small model for a few hundred steps, a final barrier, destroy_process_group, every worker returns and spawn's parent exits 0. Nothing goes wrong.
EXPECT kind=none ranks=3 launch=script class=healthy
"""
import os
import random
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from agent import attach

WORLD = 3


def worker(rank, steps):
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    attach(dist.group.WORLD)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if rank == 0:
        print(f"MARK {time.time():.6f} rank 0: training starts", flush=True)
    for step in range(steps):
        loss = model(torch.randn(16, 32)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.01)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    steps = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(300, 600)
    mp.spawn(worker, args=(steps,), nprocs=WORLD)
