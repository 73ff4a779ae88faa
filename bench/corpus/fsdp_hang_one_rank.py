"""FSDP2 (fully_shard), 3 ranks; rank 1 freezes before its forward (waiting on a lock its data thread never releases), so the others wait in FSDP's parameter all-gather.
EXPECT kind=hang culprit=1 ranks=3 launch=agent class=hang
"""
import os
import random
import threading
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
freeze_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
batch_ready = threading.Lock()

for step in range(freeze_step + 300):
    if rank == 1 and step == freeze_step:
        fault("waits forever on a lock before its forward")
        batch_ready.acquire()
        batch_ready.acquire()  # never released
    model(torch.randn(8, 16)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.01)
dist.destroy_process_group()
