"""DDP with uneven inputs handled by the Join context manager, 3 ranks: each rank gets a different number of batches (its shard's length), ranks that run out early shadow the others' all-reduces until the last one finishes. Nothing is wrong.
EXPECT kind=none ranks=3 launch=torchrun class=healthy
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")) * 7 + rank)
batches = 250 + rng.randint(0, 60)  # this rank's shard
model = DDP(nn.Linear(32, 32))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with Join([model]):
    for step in range(batches):
        model(torch.randn(8, 32)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.015)
dist.destroy_process_group()
print(f"rank {rank} done after {batches} batches", flush=True)
