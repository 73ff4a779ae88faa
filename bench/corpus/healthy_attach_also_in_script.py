"""Plain DDP training, 3 ranks under torchrun with the agent's launcher wrapper (`-m pgdash_agent`), and the script also calls attach(dist.group.WORLD) after init_process_group as the README's first example does (a user who followed both): nothing goes wrong, and each rank must be reported once.
EXPECT kind=none ranks=3 launch=torchrun class=healthy
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from agent import attach

dist.init_process_group("gloo")
attach(dist.group.WORLD)
rank = dist.get_rank()
steps = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(400, 700)
model = DDP(torch.nn.Linear(64, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
if rank == 0:
    print(f"MARK {time.time():.6f} rank 0: training starts", flush=True)
for step in range(steps):
    loss = model(torch.randn(16, 64)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.01)
dist.destroy_process_group()
