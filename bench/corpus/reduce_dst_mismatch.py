"""Plain loop, 3 ranks; the loss is reduced to rank 0 for logging, but rank 2 passes dst=2 (a rank computed from a stale variable), so the ranks disagree on the root of one reduce.
EXPECT kind=desync|hang culprit=2 ranks=3 launch=agent class=desync
"""
import os
import random
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
odd = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.zeros(256)
for step in range(odd + 400):
    grad = torch.randn(256)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    loss = w.norm().reshape(1)
    dst = 0
    if rank == 2 and step == odd:
        fault("reduces the loss to itself instead of rank 0")
        dst = 2
    dist.reduce(loss, dst=dst)
    time.sleep(0.015)
dist.destroy_process_group()
