"""Plain all_reduce loop, 3 ranks; once, rank 0 sends a tensor to rank 1 (a debugging hand-off left in `if rank == 0:`) where rank 1 and rank 2 call the step's all_reduce: a point-to-point op meets a collective.
EXPECT kind=desync|hang culprit=0 ranks=3 launch=torchrun class=p2p
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
odd_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
t = torch.ones(1024)

for step in range(odd_step + 400):
    if rank == 0 and step == odd_step:
        fault("sends to rank 1 where the others all_reduce")
        dist.send(t, dst=1)
    dist.all_reduce(t)
    t /= dist.get_world_size()
    time.sleep(0.015)
dist.destroy_process_group()
