"""A training script started with torch.multiprocessing.spawn (attach() in each worker); nothing goes wrong, but after a while the user presses Ctrl-C in the terminal (SIGINT to spawn's parent and every worker): each worker raises KeyboardInterrupt and spawn's parent stops the rest. No rank is at fault.
EXPECT kind=none ranks=3 launch=script class=healthy stop_after=5 stop=sigint
"""
import os
import random
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from agent import attach

WORLD = 3


def worker(rank, quit_step):
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    attach(dist.group.WORLD)
    w = torch.zeros(1024)
    for step in range(quit_step + 3000):
        if rank == 0 and step == quit_step:
            print(f"MARK {time.time():.6f} rank 0: the user presses Ctrl-C 5 s from now",
                  flush=True)
        grad = torch.randn(1024)
        dist.all_reduce(grad)
        w -= 0.001 * grad
        time.sleep(0.015)
    dist.destroy_process_group()


if __name__ == "__main__":
    quit_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(150, 300)
    mp.spawn(worker, args=(quit_step,), nprocs=WORLD)
