"""A training script started with torch.multiprocessing.spawn (attach() in each worker); rank 1's worker function returns mid-training (its shard's iterator ran out: a `return` where a `continue` was meant), so its process exits 0; spawn's parent waits for the others, which wait for rank 1 in all_reduce.
EXPECT kind=rank_exited_early culprit=1 ranks=3 launch=script class=exit
"""
import os
import random
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from agent import attach

WORLD, SHORT = 3, 1


def worker(rank, short_len):
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    attach(dist.group.WORLD)
    shard = range(short_len if rank == SHORT else short_len + 2000)
    batches = iter(shard)
    w = torch.randn(64, 8)
    for step in range(short_len + 2000):
        batch = next(batches, None)
        if batch is None:
            print(f"FAULT {time.time():.6f} rank {rank}: its shard ran out; the worker returns",
                  flush=True)
            return
        x = torch.randn(16, 64)
        grad = x.t() @ torch.tanh(x @ w)
        dist.all_reduce(grad)
        w -= 1e-3 * grad
        time.sleep(0.015)
    dist.destroy_process_group()


if __name__ == "__main__":
    short_len = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
    mp.spawn(worker, args=(short_len,), nprocs=WORLD)
