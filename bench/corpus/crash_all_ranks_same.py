"""Plain training under torchrun; the model's code has a bug that every rank hits at the same step (the last, smaller batch of the epoch does not fit a hard-coded reshape): every rank raises the same RuntimeError.
EXPECT kind=rank_failed culprit=0,1,2 ranks=3 launch=torchrun class=crash
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
epoch_len = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.zeros(64)

for step in range(epoch_len + 1):
    batch = 16 if step < epoch_len else 5  # the epoch's remainder
    if step == epoch_len and rank == 0:
        fault("every rank reshapes a batch of 5 as 16 x 64")
    x = torch.randn(batch * 64).view(16, 64)
    grad = x.mean(0)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
