"""Plain all_reduce training, 4 ranks under torchrun, resumed from a checkpoint: each rank reads its step counter from its own shard's metadata, and rank 3's shard was written one save later, so its counter is 10 steps ahead. Every 50 steps by its own counter a rank gathers validation metrics (all_gather_object) before its gradients' all_reduce: rank 3 gathers where the others all-reduce.
EXPECT kind=desync|hang culprit=3 ranks=4 launch=torchrun class=desync
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
resumed_at = 50 * random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(20, 30) - \
    random.Random(int(os.environ.get("CORPUS_SEED", "0")) + 1).randint(60, 140)
start = resumed_at + (10 if rank == 3 else 0)  # rank 3's shard: one save later
w = torch.zeros(2048)
for step in range(start, start + 1000):
    if step % 50 == 0:
        if rank == 3:
            fault(f"gathers validation metrics at its step {step}, 10 ahead of the others")
        seen = [None] * world
        dist.all_gather_object(seen, {"rank": rank, "step": step, "val_loss": 0.5})
    grad = torch.randn(2048)
    dist.all_reduce(grad)
    w -= 0.01 * grad / world
    time.sleep(0.015)
dist.destroy_process_group()
