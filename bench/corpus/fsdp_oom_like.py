"""FSDP2 (fully_shard), 2 ranks; rank 0 raises torch.OutOfMemoryError with CUDA's text in its forward.
EXPECT kind=rank_failed culprit=0 ranks=2 launch=agent class=oom
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

BAD = 0


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
bad_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

for step in range(bad_step + 400):
    x = torch.randn(8, 16)
    if rank == BAD and step == bad_step:
        fault("raises torch.OutOfMemoryError in its forward")
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 1.25 GiB. GPU 0 has a total capacity of "
            "39.38 GiB of which 412.00 MiB is free. Process 4121 has 38.97 GiB memory in use.")
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.005)
dist.destroy_process_group()
