"""DDP with gradient accumulation, 3 ranks; rank 1 read accumulation_steps=2 from its own config (the others use 1), so it skips DDP's gradient all-reduce every other step under no_sync(): the buckets pair up silently with the wrong steps, the others wait for rank 1 at every all-reduce (it computes two steps per all-reduce), and rank 1 runs out of collectives first and finishes while the others still wait in DDP's all-reduce. The fault is there from step 0 (the FAULT line): the goal counts the whole 300-step run.
EXPECT kind=rank_exited_early|hang|straggler culprit=1 ranks=3 launch=torchrun class=uneven goal=20
"""
import contextlib
import os
import random
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
random.Random(int(os.environ.get("CORPUS_SEED", "0"))).random()
accumulation = 2 if rank == 1 else 1
if rank == 1:
    fault("accumulation_steps=2 where the others use 1")
model = DDP(nn.Linear(32, 32))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(300):
    sync = (step + 1) % accumulation == 0
    with (contextlib.nullcontext() if sync else model.no_sync()):
        model(torch.randn(8, 32)).pow(2).mean().backward()
    if sync:
        opt.step()
        opt.zero_grad()
    time.sleep(0.015)
dist.destroy_process_group()
print(f"rank {rank} done", flush=True)
