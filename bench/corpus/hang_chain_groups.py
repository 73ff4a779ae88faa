"""Two groups: the world and B=[2, 3]; rank 3 sleeps, rank 2 waits for it in B, ranks 0 and 1 wait for rank 2 in the world group.
EXPECT kind=hang culprit=3 ranks=4 launch=torchrun class=chain
"""
import os
import random
import time

import torch
import torch.distributed as dist

STUCK = 3


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
pair = dist.new_group([2, 3])
stuck_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
t, expert = torch.ones(512), torch.ones(128)

for step in range(stuck_at + 500):
    if rank == STUCK and step == stuck_at:
        fault("sleeps; its pair partner waits in group B, the rest in the world group")
        time.sleep(3600)
    if rank in (2, 3):
        dist.all_reduce(expert, group=pair)  # the experts the pair shares
        expert /= 2
    dist.all_reduce(t)
    t /= world
    time.sleep(0.015)
dist.destroy_process_group()
