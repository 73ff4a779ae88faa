"""Plain all_reduce training, 4 ranks under torchrun; every rank makes a "pair" group for tensor parallelism with dist.new_group, but rank 3 computes its pair from a stale config (ranks [2, 3] for everyone else, [1, 3] on rank 3): the group has one name and different members on different ranks, and the first all_reduce on it never completes on ranks 2 and 3.
EXPECT kind=desync|hang culprit=3 ranks=4 launch=torchrun class=desync
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
tp_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
t = torch.ones(1024)
pairs = None
for step in range(tp_at + 300):
    dist.all_reduce(t)
    t /= dist.get_world_size()
    if step == tp_at:  # tensor parallelism switched on after warm-up
        first = dist.new_group([0, 1])
        if rank == 3:
            fault("makes its pair group from a stale config: [1, 3] instead of [2, 3]")
            second = dist.new_group([1, 3])
        else:
            second = dist.new_group([2, 3])
        pairs = first if rank in (0, 1) else second
    if pairs is not None:
        x = torch.ones(256)
        dist.all_reduce(x, group=pairs)
    time.sleep(0.015)
dist.destroy_process_group()
