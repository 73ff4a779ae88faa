"""Plain all_reduce training, 3 ranks under torchrun, wrapped in try/finally whose finally calls dist.barrier() "so no rank tears down while others still write" before destroy_process_group. Rank 1 raises a KeyError on a missing batch field; its finally calls barrier while the others are in all_reduce, so its traceback is never printed.
EXPECT kind=desync|hang|rank_failed culprit=1 ranks=3 launch=torchrun class=desync
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
bad = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.zeros(1024)
try:
    for step in range(bad + 400):
        batch = {"x": torch.randn(1024)}
        if rank == 1 and step == bad:
            fault("raises KeyError; its finally block calls dist.barrier()")
            del batch["x"]
        grad = batch["x"] * 0.1
        dist.all_reduce(grad)
        w -= 0.01 * grad
        time.sleep(0.015)
finally:
    dist.barrier()
    dist.destroy_process_group()
