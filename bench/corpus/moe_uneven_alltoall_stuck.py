"""Mixture-of-experts style loop, 4 ranks, all_to_all_single with uneven split sizes (each rank sends a different number of tokens); rank 3's expert computation never returns once (a kernel stuck in a retry loop), so it never enters the next token exchange while the others wait inside it, each with its own sizes.
EXPECT kind=hang culprit=3 ranks=4 launch=torchrun class=hang
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
rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")) * 11 + rank)
stuck_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
for step in range(stuck_step + 300):
    send_counts = torch.tensor([rng.randint(1, 64) for _ in range(world)])
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    tokens = torch.randn(int(send_counts.sum()), 16)
    if rank == 3 and step == stuck_step:
        fault("its expert computation never returns")
        while True:
            time.sleep(0.05)
    out = torch.empty(int(recv_counts.sum()), 16)
    dist.all_to_all_single(out, tokens, output_split_sizes=recv_counts.tolist(),
                           input_split_sizes=send_counts.tolist())
    time.sleep(0.01)
dist.destroy_process_group()
