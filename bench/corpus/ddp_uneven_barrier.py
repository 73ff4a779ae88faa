"""DDP with uneven inputs: rank 1's shard runs out first; it goes on to the end-of-epoch barrier while the others are in DDP's gradient all-reduce.
EXPECT kind=desync|hang culprit=1 ranks=4 launch=torchrun class=uneven
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

SHORT = 1


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")))
batches = rng.randint(60, 160)  # the shard sizes: every rank's but one ...
if rank == SHORT:
    batches -= rng.randint(3, 10)  # ... which got fewer samples after filtering
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

for epoch in range(2):
    for i in range(batches):
        x, y = torch.randn(16, 32), torch.randn(16, 1)
        time.sleep(0.01)  # loading
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    if rank == SHORT:
        fault("its data ran out: goes to the end-of-epoch barrier while the others are in "
              "DDP's all-reduce")
    dist.barrier()
dist.destroy_process_group()
