"""Plain loop gathering per-rank metrics with all_gather_into_tensor, 3 ranks; rank 2 sizes its output buffer from a stale world size (2 instead of 3) once, so its call is refused before it enters the collective while the others wait in it.
EXPECT kind=rank_failed culprit=2 ranks=3 launch=torchrun class=crash
"""
import os
import random
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
bad_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
metrics = torch.ones(4)

for step in range(bad_step + 400):
    seen_world = world
    if rank == 2 and step == bad_step:
        fault("sizes its all_gather output for 2 ranks")
        seen_world = 2
    out = torch.empty(seen_world * 4)
    dist.all_gather_into_tensor(out, metrics)
    time.sleep(0.015)
dist.destroy_process_group()
