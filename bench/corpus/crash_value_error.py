"""Plain all_reduce training; rank 1 raises a ValueError in its own training code (a corrupt sample).
EXPECT kind=rank_failed culprit=1 ranks=3 launch=agent class=crash
"""
import os
import random
import time

import torch
import torch.distributed as dist

BAD = 1


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


def load_batch(step, rank):
    batch = torch.randn(16, 64)
    if rank == BAD and step == bad_step:
        fault("raises ValueError on a corrupt sample")
        batch = batch[:15]
    if batch.shape[0] != 16:
        raise ValueError(f"expected a batch of 16 samples, got {batch.shape[0]} "
                         f"(corrupt record in shard-{rank:05d}.tar)")
    return batch


dist.init_process_group("gloo")
rank = dist.get_rank()
bad_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.randn(64, 8)

for step in range(bad_step + 400):
    x = load_batch(step, rank)
    grad = x.t() @ torch.tanh(x @ w)
    dist.all_reduce(grad)
    w -= 1e-3 * grad
    time.sleep(0.015)
dist.destroy_process_group()
