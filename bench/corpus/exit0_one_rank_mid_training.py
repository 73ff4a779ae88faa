"""Plain all_reduce training under torchrun; rank 2 reads a stale "max_steps" from its node's config and calls sys.exit(0) when it thinks it is done, while the others go on and wait for it in all_reduce.
EXPECT kind=rank_exited_early culprit=2 ranks=3 launch=torchrun class=exit
"""
import os
import random
import sys
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
max_steps = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
mine = max_steps if rank == 2 else max_steps + 400
w = torch.zeros(1024)
for step in range(max_steps + 400):
    if step == mine:
        fault("thinks training is done and calls sys.exit(0)")
        print(f"rank {rank}: reached max_steps={mine}, done", flush=True)
        sys.exit(0)
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
