"""Plain loop, 4 ranks; every epoch (40 steps) the code builds fresh process groups for the pairs it averages within (new_group per epoch, the old ones destroyed), as some curriculum and gossip trainers do. Nothing is wrong.
EXPECT kind=none ranks=4 launch=torchrun class=healthy
"""
import os
import random
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")))  # the same on every rank
w = torch.ones(256)
for epoch in range(8):
    order = list(range(world))
    rng.shuffle(order)
    pairs = [sorted(order[i:i + 2]) for i in range(0, world, 2)]
    groups = [dist.new_group(p) for p in pairs]  # every rank creates every group
    mine = next(g for p, g in zip(pairs, groups) if rank in p)
    for step in range(40):
        dist.all_reduce(w, group=mine)
        w /= 2
        dist.all_reduce(w)
        w /= world
        time.sleep(0.015)
    for g in groups:
        dist.destroy_process_group(g)
dist.destroy_process_group()
