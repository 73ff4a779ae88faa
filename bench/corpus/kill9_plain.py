"""Plain all_reduce loop, 3 ranks; rank 1 is killed with SIGKILL (as the kernel's OOM killer does).
EXPECT kind=rank_lost culprit=1 ranks=3 launch=agent class=lost
"""
import os
import random
import signal
import time

import torch
import torch.distributed as dist

VICTIM_OF_OOM_KILLER = 1


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
kill_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
t = torch.ones(1024)

for step in range(kill_step + 400):
    if rank == VICTIM_OF_OOM_KILLER and step == kill_step:
        fault("killed with SIGKILL")
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(t)
    t /= dist.get_world_size()
    time.sleep(0.015)
dist.destroy_process_group()
