"""DDP with uneven inputs: rank 2 runs out of data and all-reduces its epoch loss while the others are still in DDP's gradient all-reduce.
EXPECT kind=desync|rank_lost culprit=2 ranks=3 launch=agent class=uneven

gloo catches the size mismatch on rank 2 itself: "Received data size doesn't match expected
size. Is there a distributed collective mismatch in your code?" and aborts it (SIGABRT, from
C++: no Python exception), so naming rank 2 as a desync or as lost is right; the others then
fail with "Connection reset by peer" (victims).
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

SHORT = 2


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")))
samples = rng.randint(1000, 2400) - (rng.randint(50, 150) if rank == SHORT else 0)
loader = [torch.randn(16, 20) for _ in range(samples // 16)]
model = DDP(torch.nn.Sequential(torch.nn.Linear(20, 40), torch.nn.GELU(), torch.nn.Linear(40, 1)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

for epoch in range(2):
    total = torch.zeros(1)
    for x in loader:
        time.sleep(0.008)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        total += loss.detach()
    if rank == SHORT:
        fault("its data ran out: all-reduces the epoch loss while the others are in DDP's "
              "all-reduce")
    dist.all_reduce(total)
    if rank == 0:
        print(f"epoch {epoch} loss {total.item():.3f}", flush=True)
dist.destroy_process_group()
