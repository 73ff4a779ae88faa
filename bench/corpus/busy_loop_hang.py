"""Plain all_reduce training under torchrun; rank 1 enters a pure-Python loop that never ends (a retry loop whose condition cannot become true), holding the GIL; the others wait in all_reduce.
EXPECT kind=hang culprit=1 ranks=3 launch=torchrun class=hang
"""
import os
import random
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


def fetch_with_retry(step, rank):
    tries = 0
    while rank == 1 and step == bad_step:  # the "retry until the shard is ready" bug
        tries += 1
        if tries == 1:
            fault("spins in a retry loop that never ends")
    return torch.randn(1024)


dist.init_process_group("gloo")
rank = dist.get_rank()
bad_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.zeros(1024)

for step in range(bad_step + 400):
    grad = fetch_with_retry(step, rank)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
