"""Plain all_reduce training under torchrun with a prefetch thread per rank; on rank 1 the prefetch thread raises (a corrupt record) and dies, and the main thread then waits forever on the empty queue, while the others wait in all_reduce.
EXPECT kind=hang culprit=1 ranks=3 launch=torchrun class=hang
"""
import os
import queue
import random
import threading
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


def prefetch(q, rank, bad_at):
    for i in range(10**6):
        if rank == 1 and i == bad_at:
            fault("the prefetch thread raises on a corrupt record")
            raise ValueError(f"corrupt record {i} in shard-{rank:05d}.tar")
        q.put(torch.randn(1024))


dist.init_process_group("gloo")
rank = dist.get_rank()
bad_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
q = queue.Queue(maxsize=4)
threading.Thread(target=prefetch, args=(q, rank, bad_at), daemon=True).start()
w = torch.zeros(1024)
for step in range(bad_at + 400):
    grad = q.get()
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
