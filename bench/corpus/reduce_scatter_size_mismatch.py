"""Sharded-gradient training with reduce_scatter_tensor under torchrun; rank 0 pads its flat gradient to a different length (a stale padding rule), so its input size disagrees with the others'.
EXPECT kind=rank_lost|rank_failed|desync|hang culprit=0 ranks=3 launch=torchrun class=mismatch
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
bad_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
shard = 256
for step in range(bad_step + 400):
    n = shard * world
    if rank == 0 and step >= bad_step:
        if step == bad_step:
            fault("pads its flat gradient to a different length")
        n = (shard + 8) * world
    flat = torch.randn(n)
    out = torch.empty(n // world)
    dist.reduce_scatter_tensor(out, flat)
    time.sleep(0.015)
dist.destroy_process_group()
