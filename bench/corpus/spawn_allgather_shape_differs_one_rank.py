"""A training script started with torch.multiprocessing.spawn (attach() in each worker); every 20 steps the ranks all_gather their predictions for a metric, and at a random evaluation rank 0's last batch is smaller (its shard's remainder: drop_last=False), so its tensor's size differs from the others'.
EXPECT kind=desync|rank_failed culprit=0 ranks=3 launch=script class=desync
"""
import os
import random
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from agent import attach

WORLD, SHORT = 3, 0


def worker(rank, bad_eval):
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    attach(dist.group.WORLD)
    w = torch.randn(64, 8)
    for step in range(bad_eval * 20 + 400):
        x = torch.randn(16, 64)
        grad = x.t() @ torch.tanh(x @ w)
        dist.all_reduce(grad)
        w -= 1e-3 * grad
        if step % 20 == 19:
            n = 32
            if rank == SHORT and step // 20 == bad_eval:
                print(f"FAULT {time.time():.6f} rank {rank}: its last eval batch has 20 rows, "
                      "not 32", flush=True)
                n = 20
            preds = torch.randn(n)
            out = [torch.empty(32) for _ in range(WORLD)]
            dist.all_gather(out, preds)
        time.sleep(0.015)
    dist.destroy_process_group()


if __name__ == "__main__":
    bad_eval = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(3, 8)
    mp.spawn(worker, args=(bad_eval,), nprocs=WORLD)
