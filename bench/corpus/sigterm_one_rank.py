"""Plain all_reduce loop, 3 ranks started by hand; the scheduler preempts rank 1's node: rank 1 gets SIGTERM (no handler: it dies at once) while the others go on.
EXPECT kind=rank_lost|rank_failed culprit=1 ranks=3 launch=agent class=lost
"""
import os
import random
import signal
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
kill_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
t = torch.ones(1024)

for step in range(kill_step + 400):
    if rank == 1 and step == kill_step:
        fault("SIGTERM from the scheduler")
        os.kill(os.getpid(), signal.SIGTERM)
    dist.all_reduce(t)
    t /= dist.get_world_size()
    time.sleep(0.015)
dist.destroy_process_group()
