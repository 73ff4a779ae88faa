"""Plain all_reduce training, 3 ranks under torchrun; rank 0 returns from main right after its last step (an early `return` left in a `if rank == 0:` branch that used to save the model), skipping the final `dist.barrier()` and `destroy_process_group()` the others call; the others' barrier then fails on the connections rank 0's exit closed.
EXPECT kind=rank_exited_early culprit=0 ranks=3 launch=torchrun class=early_exit
"""
import os
import random
import sys
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    steps = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(100, 200)
    t = torch.ones(1024)
    for step in range(steps):
        dist.all_reduce(t)
        t /= dist.get_world_size()
        time.sleep(0.015)
    if rank == 0:
        fault("returns from main without the final barrier")
        return 0
    time.sleep(0.5)  # the others write their final logs
    dist.barrier()
    dist.destroy_process_group()
    return 0


sys.exit(main())
