"""DDP with ZeroRedundancyOptimizer (each rank owns a shard of the optimizer state and broadcasts its updated parameters in step()), 3 ranks under torchrun; once, rank 1's gradient check finds an inf and it skips optimizer.step(): the others wait in ZeRO's parameter broadcasts while rank 1 goes on to the next step's gradient all-reduce.
EXPECT kind=desync|hang culprit=1 ranks=3 launch=torchrun class=desync
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.01)
bad_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
for step in range(bad_step + 300):
    model(torch.randn(16, 32)).pow(2).mean().backward()
    finite = not (rank == 1 and step == bad_step)
    if finite:
        opt.step()
    else:
        fault("finds an inf gradient and skips optimizer.step()")
    opt.zero_grad()
    time.sleep(0.01)
dist.destroy_process_group()
