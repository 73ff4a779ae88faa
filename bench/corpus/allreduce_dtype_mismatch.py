"""Plain loop, 3 ranks; rank 1 turns on float16 gradients from its own config once (its tensor is half the bytes of the others'), so the all_reduce of that step carries another dtype on rank 1.
EXPECT kind=desync|rank_lost culprit=1 ranks=3 launch=agent class=desync
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
odd_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
grad = torch.ones(1024)

for step in range(odd_step + 400):
    g = grad
    if rank == 1 and step == odd_step:
        fault("all_reduces float16 where the others use float32")
        g = grad.half()
    dist.all_reduce(g)
    time.sleep(0.015)
dist.destroy_process_group()
