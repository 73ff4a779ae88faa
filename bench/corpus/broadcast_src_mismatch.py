"""Plain loop, 3 ranks; every 20 steps the weights are broadcast from rank 0, but rank 1 passes src=1 (it read the source rank from its own LOCAL_RANK-based config), so the broadcast never matches.
EXPECT kind=desync culprit=1 ranks=3 launch=agent class=desync
"""
import os
import random
import time

import torch
import torch.distributed as dist

ODD = 1


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
odd_from = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(3, 8) * 20
w = torch.ones(256)

for step in range(odd_from + 400):
    dist.all_reduce(w)
    w /= dist.get_world_size()
    if step % 20 == 0 and step > 0:
        src = 0
        if rank == ODD and step == odd_from:
            fault("broadcasts with src=1 where the others use src=0")
            src = 1
        dist.broadcast(w, src=src)
    time.sleep(0.015)
dist.destroy_process_group()
