"""A training script started with torch.multiprocessing.spawn that attaches the agent itself (attach() in the worker); rank 1 raises in its own code, and spawn then terminates the other workers.
EXPECT kind=rank_failed culprit=1 ranks=3 launch=script class=crash
"""
import os
import random
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from agent import attach

WORLD, BAD = 3, 1


def fault(rank, what):
    print(f"FAULT {time.time():.6f} rank {rank}: {what}", flush=True)


def worker(rank, bad_step):
    attach()
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    w = torch.randn(64, 8)
    for step in range(bad_step + 400):
        x = torch.randn(16, 64)
        if rank == BAD and step == bad_step:
            fault(rank, "KeyError in the metrics code")
            stats = {}
            print(stats["loss_ema"])
        grad = x.t() @ torch.tanh(x @ w)
        dist.all_reduce(grad)
        w -= 1e-3 * grad
        time.sleep(0.015)
    dist.destroy_process_group()


if __name__ == "__main__":
    bad_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
    mp.spawn(worker, args=(bad_step,), nprocs=WORLD)
