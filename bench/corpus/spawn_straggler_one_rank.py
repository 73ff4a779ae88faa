"""A training script started with torch.multiprocessing.spawn that attaches the agent in each worker; from a random step on, rank 2's input pipeline (a slow augmentation on its shard) makes it 60 ms late at every step, and the others wait for it in all_reduce.
EXPECT kind=straggler culprit=2 ranks=3 launch=script class=straggler
"""
import os
import random
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from agent import attach

WORLD, SLOW, SLOW_STEPS = 3, 2, 200


def worker(rank, slow_from):
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    attach(dist.group.WORLD)
    w = torch.randn(64, 8)
    for step in range(slow_from + SLOW_STEPS):
        x = torch.randn(16, 64)
        if rank == SLOW and step == slow_from:
            print(f"FAULT {time.time():.6f} rank {rank}: its augmentation gets 60 ms slower",
                  flush=True)
        if rank == SLOW and step >= slow_from:
            time.sleep(0.06)
        grad = x.t() @ torch.tanh(x @ w)
        dist.all_reduce(grad)
        w -= 1e-3 * grad
        time.sleep(0.015)
        if rank == SLOW and step >= slow_from:
            print(f"STEP {step - slow_from + 1} {time.time():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    slow_from = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(80, 200)
    mp.spawn(worker, args=(slow_from,), nprocs=WORLD)
