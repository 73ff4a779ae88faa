"""Plain loop, 3 ranks under torchrun; the grad-norm all_reduce takes its op from a per-node config, and rank 1's stale config says MAX where the others say SUM: every call still completes, with a different op on one rank.
EXPECT kind=desync culprit=1 ranks=3 launch=torchrun class=desync
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
switch = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.zeros(512)
for step in range(switch + 400):
    grad = torch.randn(512)
    dist.all_reduce(grad)
    norm = grad.pow(2).sum().reshape(1)
    # after a config reload, rank 1's node file says "max" for the norm's reduction
    op = dist.ReduceOp.MAX if (rank == 1 and step >= switch) else dist.ReduceOp.SUM
    if rank == 1 and step == switch:
        fault("reduces the grad norm with MAX where the others use SUM")
    dist.all_reduce(norm, op=op)
    w -= 0.01 * grad / (norm.sqrt() + 1)
    time.sleep(0.015)
dist.destroy_process_group()
