"""Plain data parallel under torchrun, 3 ranks: each step all-reduces the gradients (1,024 floats) and then the loss (one float). Rank 1 hits an out-of-memory error in its optimizer step once, catches it, frees its cache and retries the whole step, so it all-reduces its gradients a second time while the others all-reduce their loss.
EXPECT kind=desync|rank_failed|rank_lost|hang culprit=1 ranks=3 launch=torchrun class=mismatch
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
oom_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.zeros(1024)


def step(i, first_try):
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    if rank == 1 and i == oom_step and first_try:
        fault("retries its step after an OOM, all-reducing its gradients twice")
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    loss = grad.pow(2).mean().reshape(1)
    dist.all_reduce(loss)
    return grad


for i in range(oom_step + 400):
    try:
        grad = step(i, True)
    except torch.OutOfMemoryError as exc:
        print(f"rank {rank}: {exc}; emptying the cache and retrying the step", flush=True)
        grad = step(i, False)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
