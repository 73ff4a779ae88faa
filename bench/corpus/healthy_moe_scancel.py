"""Mixture-of-experts style loop, 3 ranks under torchrun: tokens are routed with all_to_all_single and uneven split sizes (each rank sends a different number of tokens to each expert), and the exchange of a large batch takes a while; after a while the user cancels the job (scancel: SIGTERM to every rank), caught mid-exchange with every rank inside an all_to_all of its own size. Nothing is wrong.
EXPECT kind=none ranks=3 launch=torchrun class=healthy stop_after=8 stop=sigterm
"""
import os
import random
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")) * 11 + rank)
print(f"MARK {time.time():.6f}", flush=True)
for step in range(100000):
    send_counts = torch.tensor([rng.randint(2000, 20000) for _ in range(world)])
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    tokens = torch.randn(int(send_counts.sum()), 64)
    out = torch.empty(int(recv_counts.sum()), 64)
    dist.all_to_all_single(out, tokens, output_split_sizes=recv_counts.tolist(),
                           input_split_sizes=send_counts.tolist())
    time.sleep(rng.uniform(0, 0.01))
dist.destroy_process_group()
