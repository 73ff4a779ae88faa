"""Data parallel with overlapped communication, 3 ranks under torchrun: each step's all_reduce is issued with async_op=True and waited with work.wait(timeout=6 s), the step's guard against a stuck peer; rank 2 blocks forever reading a dataset shard from a dead network mount, so ranks 0 and 1 raise their wait timeout and torchrun stops the job.
EXPECT kind=hang|rank_lost culprit=2 ranks=3 launch=torchrun class=hang
"""
import os
import random
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

STUCK = 2


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
stuck_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.zeros(2048)
for step in range(stuck_at + 400):
    if rank == STUCK and step == stuck_at:
        fault("blocks reading its shard from a dead network mount")
        threading.Event().wait()  # a read(2) on a hung NFS mount never returns
    grad = torch.randn(2048)
    work = dist.all_reduce(grad, async_op=True)
    time.sleep(0.01)  # the next batch's forward meanwhile
    work.wait(timeout=timedelta(seconds=6))
    w -= 0.01 * grad
    time.sleep(0.01)
dist.destroy_process_group()
