"""Plain all_reduce loop, 3 ranks; every 50 steps rank 0 alone calls dist.barrier() before logging (a `barrier()` left inside an `if rank == 0:` block), so rank 0's barrier meets the others' all_reduce.
EXPECT kind=desync culprit=0 ranks=3 launch=torchrun class=desync
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
first_log = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(2, 5) * 50
t = torch.ones(1024)

for step in range(first_log + 400):
    dist.all_reduce(t)
    t /= dist.get_world_size()
    if rank == 0 and step == first_log:
        fault("calls dist.barrier() inside `if rank == 0:`")
        dist.barrier()
        print(f"step {step} loss {t.mean().item():.4f}", flush=True)
    time.sleep(0.015)
dist.destroy_process_group()
