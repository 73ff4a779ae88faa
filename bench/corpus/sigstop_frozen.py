"""Plain all_reduce loop, 3 ranks; rank 2's process is stopped (SIGSTOP, as a debugger attach, a job scheduler's suspend or a swapped-out host does): it stays alive but every thread of it freezes, its agent too.
EXPECT kind=hang|rank_lost culprit=2 ranks=3 launch=agent class=frozen stop_after=40 stop=sigterm
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
stop_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
t = torch.ones(1024)

for step in range(stop_step + 400):
    if rank == 2 and step == stop_step:
        fault("the process is stopped with SIGSTOP")
        os.kill(os.getpid(), signal.SIGSTOP)
    dist.all_reduce(t)
    t /= dist.get_world_size()
    time.sleep(0.015)
dist.destroy_process_group()
