"""4 ranks under torchrun; after a warm-up on the whole job, each rank builds a 2x2 layout from its config, calling dist.new_group for every group of every dimension (all ranks make every call, as torch requires), then all-reduces on its tp and dp groups. Rank 1 read a stale copy of the config that lists the dp dimension before tp, so it makes the same four groups in another order: its groups and the others' never meet.
EXPECT kind=desync|hang|stall culprit=1 ranks=4 launch=torchrun class=desync
"""
import os
import random
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
switch = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
layout = {"tp": [[0, 1], [2, 3]], "dp": [[0, 2], [1, 3]]}
if rank == 1:
    layout = {"dp": layout["dp"], "tp": layout["tp"]}  # the stale copy
g = torch.zeros(1024)
for step in range(switch):
    g.normal_()
    dist.all_reduce(g)
    time.sleep(0.015)
if rank == 1:
    print(f"FAULT {time.time():.6f} rank 1: makes the dp groups before the tp groups", flush=True)
mine = {}
for dim, groups in layout.items():
    for ranks in groups:
        pg = dist.new_group(ranks)
        if rank in ranks:
            mine[dim] = pg
for step in range(300):
    g.normal_()
    dist.all_reduce(g, group=mine["tp"])
    dist.all_reduce(g, group=mine["dp"])
    time.sleep(0.015)
dist.destroy_process_group()
