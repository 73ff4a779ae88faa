"""Plain all_reduce loop; rank 0 (whose process also serves the rendezvous store the others ask during training) is killed with SIGKILL, as the OOM killer does to the rank that holds the most host memory.
EXPECT kind=rank_lost culprit=0 ranks=3 launch=agent class=lost
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
store = dist.distributed_c10d._get_default_store()
kill_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
t = torch.ones(1024)

for step in range(kill_step + 400):
    if rank == 0 and step == kill_step:
        fault("rank 0 (the store's host) killed with SIGKILL")
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(t)
    t /= dist.get_world_size()
    if step % 25 == 0:
        store.add("steps_seen", 1)  # a progress counter some trainers keep in the store
    time.sleep(0.015)
dist.destroy_process_group()
