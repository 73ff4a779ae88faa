"""Expert-parallel style loop, 3 ranks: tokens are exchanged with all_to_all_single every step; rank 2 gets stuck in its router (an endless retry loop in Python) and never enters the next all_to_all.
EXPECT kind=hang culprit=2 ranks=3 launch=torchrun class=hang
"""
import os
import random
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


def route(tokens, stuck):
    while stuck:  # a retry loop whose condition never clears
        time.sleep(0.05)
    return tokens


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
stuck_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
tokens = torch.randn(world * 32)
out = torch.empty_like(tokens)

for step in range(stuck_step + 400):
    stuck = rank == 2 and step == stuck_step
    if stuck:
        fault("stuck in its router before all_to_all")
    dist.all_to_all_single(out, route(tokens, stuck))
    tokens = out * 0.5 + tokens * 0.5
    dist.all_reduce(tokens[:8])
    time.sleep(0.015)
dist.destroy_process_group()
