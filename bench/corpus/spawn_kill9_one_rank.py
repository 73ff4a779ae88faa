"""A training script started with torch.multiprocessing.spawn, attach() in each worker; rank 1 is killed by the OOM killer (SIGKILL), and spawn then terminates the other workers.
EXPECT kind=rank_lost culprit=1 ranks=3 launch=script class=lost
"""
import os
import random
import signal
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from agent import attach

WORLD, KILLED = 3, 1


def worker(rank, kill_step):
    attach()
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    w = torch.zeros(1024)
    for step in range(kill_step + 400):
        if rank == KILLED and step == kill_step:
            print(f"FAULT {time.time():.6f} rank {rank}: SIGKILL by the OOM killer", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        grad = torch.randn(1024)
        dist.all_reduce(grad)
        w -= 0.01 * grad
        time.sleep(0.015)
    dist.destroy_process_group()


if __name__ == "__main__":
    kill_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
    mp.spawn(worker, args=(kill_step,), nprocs=WORLD)
