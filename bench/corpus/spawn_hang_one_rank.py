"""A training script started with torch.multiprocessing.spawn, attach() called after init_process_group with the group; rank 2 blocks forever reading from a queue its producer thread stopped feeding, the others wait in all_reduce.
EXPECT kind=hang culprit=2 ranks=3 launch=script class=hang
"""
import os
import queue
import random
import threading
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from agent import attach

WORLD, STUCK = 3, 2


def producer(q, rank, stop_at):
    for i in range(10**6):
        if rank == STUCK and i == stop_at:
            print(f"FAULT {time.time():.6f} rank {rank}: the batch producer thread stops", flush=True)
            return  # e.g. an exception swallowed in a reader thread
        q.put(torch.randn(16, 64))


def worker(rank, stop_at):
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    attach(dist.group.WORLD)
    q = queue.Queue(maxsize=4)
    threading.Thread(target=producer, args=(q, rank, stop_at), daemon=True).start()
    w = torch.randn(64, 8)
    for step in range(stop_at + 400):
        x = q.get()
        grad = x.t() @ torch.tanh(x @ w)
        dist.all_reduce(grad)
        w -= 1e-3 * grad
        time.sleep(0.015)
    dist.destroy_process_group()


if __name__ == "__main__":
    stop_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
    mp.spawn(worker, args=(stop_at,), nprocs=WORLD)
