"""Plain all_reduce training, 3 ranks under torchrun, with a data-parallel subgroup [0, 1] every rank made at the start; before each checkpoint every rank calls dist.barrier() on the whole job, but rank 1 was refactored to call dist.barrier(group=dp) instead: rank 1 waits in the subgroup's barrier for rank 0, rank 0 waits in the job's barrier for rank 1.
EXPECT kind=desync|hang culprit=1 ranks=3 launch=torchrun class=desync
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
dp = dist.new_group([0, 1])
ckpt_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
t = torch.ones(1024)
for step in range(ckpt_at + 300):
    dist.all_reduce(t)
    t /= dist.get_world_size()
    if step % 40 == 39 and rank in (0, 1):
        s = torch.ones(4)
        dist.all_reduce(s, group=dp)  # the data-parallel loss average
    if step == ckpt_at:
        if rank == 1:
            fault("calls barrier on the data-parallel subgroup instead of the whole job")
            dist.barrier(group=dp)
        else:
            dist.barrier()
    time.sleep(0.015)
dist.destroy_process_group()
