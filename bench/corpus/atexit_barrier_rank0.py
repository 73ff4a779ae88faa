"""Plain all_reduce training, 3 ranks under torchrun; rank 0 registers an atexit hook that calls dist.barrier() "so the others wait for its final log upload", but ranks 1 and 2 finish normally, destroy their process group and exit 0: rank 0's barrier at exit has no partner.
EXPECT kind=desync|hang|rank_failed culprit=0 ranks=3 launch=torchrun class=exit
"""
import atexit
import os
import random
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
steps = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(150, 300)


def upload_logs_then_sync():
    fault("calls dist.barrier() in an atexit hook only it registered")
    dist.barrier()
    print("logs uploaded", flush=True)


if rank == 0:
    atexit.register(upload_logs_then_sync)

w = torch.zeros(1024)
for step in range(steps):
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
print(f"rank {rank}: training done", flush=True)
if rank != 0:
    dist.destroy_process_group()
