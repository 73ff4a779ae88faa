"""MoE-style token exchange with all_to_all_single under torchrun; rank 1 computes its receive splits from a stale routing table, so its splits disagree with what the others send it.
EXPECT kind=rank_lost|rank_failed|desync|hang culprit=1 ranks=3 launch=torchrun class=mismatch
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

for step in range(bad_step + 400):
    send = [4] * world
    recv = [4] * world
    if rank == 1 and step >= bad_step:
        if step == bad_step:
            fault("receive splits from a stale routing table")
        recv = [3, 4, 5]
    tokens = torch.randn(sum(send), 8)
    out = torch.empty(sum(recv), 8)
    dist.all_to_all_single(out, tokens, output_split_sizes=recv, input_split_sizes=send)
    time.sleep(0.015)
dist.destroy_process_group()
