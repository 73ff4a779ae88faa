"""Plain all_reduce training, ranks started by hand; a library on rank 1 hits a fatal condition and calls os._exit(3): no traceback, no atexit, no cleanup.
EXPECT kind=rank_lost|rank_failed|rank_exited_early culprit=1 ranks=3 launch=agent class=lost
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
bad_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.zeros(1024)

for step in range(bad_step + 400):
    if rank == 1 and step == bad_step:
        fault("a library calls os._exit(3)")
        print("fatal: shard index corrupt, aborting", flush=True)
        os._exit(3)
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
