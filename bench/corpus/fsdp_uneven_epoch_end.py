"""FSDP2 (fully_shard), 3 ranks under torchrun; each rank iterates its own shard without DistributedSampler's padding, and rank 1's shard is one batch shorter, so at the end of the epoch it goes on to the validation barrier while the others still run FSDP's all-gather for their last batch.
EXPECT kind=desync|hang culprit=1 ranks=3 launch=torchrun class=uneven
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
batches = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(100, 200)
mine = batches - 1 if rank == 1 else batches  # 3,197 samples over 3 ranks, batch 8
for step in range(mine):
    model(torch.randn(8, 16)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.01)
if rank == 1:
    fault("its shard is one batch shorter: it goes to the validation barrier early")
dist.barrier()  # "validation starts together"
dist.destroy_process_group()
