"""Plain loop, 3 ranks under torchrun; rank 0 scatters each step's batch indices to the ranks; once it builds one chunk too few (an off-by-one on the last partial batch), so rank 0's scatter raises while the others wait in it.
EXPECT kind=rank_failed culprit=0 ranks=3 launch=torchrun class=crash
"""
import os
import random
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
bad = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
for step in range(bad + 400):
    out = torch.zeros(16, dtype=torch.long)
    chunks = None
    if rank == 0:
        n = world - 1 if step == bad else world
        if step == bad:
            fault("builds one chunk of batch indices too few")
        chunks = [torch.arange(16) + 16 * i for i in range(n)]
    dist.scatter(out, chunks, src=0)
    time.sleep(0.015)
dist.destroy_process_group()
