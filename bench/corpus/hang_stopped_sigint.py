"""4-rank torchrun job; rank 2 sleeps forever instead of entering all_reduce; 25 s later the user presses Ctrl-C (SIGINT to torchrun and every rank).
EXPECT kind=hang culprit=2 ranks=4 launch=torchrun class=stopped stop_after=25 stop=sigint
"""
import os
import random
import time

import torch
import torch.distributed as dist

STUCK = 2


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
stuck_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
t = torch.ones(512)

for step in range(stuck_at + 500):
    if rank == STUCK and step == stuck_at:
        fault("sleeps forever instead of entering all_reduce")
        time.sleep(3600)
    dist.all_reduce(t)
    t /= dist.get_world_size()
    time.sleep(0.02)
dist.destroy_process_group()
