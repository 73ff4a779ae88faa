"""Mixture-of-experts style loop, 3 ranks: tokens are routed with all_to_all_single and uneven split sizes (each rank sends a different number of tokens to each expert, as a router does), with 0-20 ms of jitter per rank per step. Nothing is wrong.
EXPECT kind=none ranks=3 launch=torchrun class=healthy
"""
import os
import random
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")) * 11 + rank)
for step in range(500):
    # A split every rank agrees on: the counts are exchanged first, as MoE layers do.
    send_counts = torch.tensor([rng.randint(1, 64) for _ in range(world)])
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    tokens = torch.randn(int(send_counts.sum()), 16)
    out = torch.empty(int(recv_counts.sum()), 16)
    dist.all_to_all_single(out, tokens, output_split_sizes=recv_counts.tolist(),
                           input_split_sizes=send_counts.tolist())
    grad = torch.randn(256)
    dist.all_reduce(grad)
    time.sleep(0.005 + rng.uniform(0, 0.02))
dist.destroy_process_group()
