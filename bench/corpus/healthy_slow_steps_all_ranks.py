"""Plain training, 3 ranks under torchrun, with a large gradient accumulation: each optimizer step runs 12-18 s of micro-batches (forward and backward on the CPU) with no collective, as DDP's no_sync does, then one all_reduce of the gradients. Slow by design on every rank; nothing is wrong.
EXPECT kind=none ranks=3 launch=torchrun class=healthy
"""
import os
import random
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")) * 10 + rank)
w = torch.randn(256, 256) * 0.01
if rank == 0:
    print(f"MARK {time.time():.6f} rank 0: training starts (an optimizer step every 12-18 s)",
          flush=True)
for step in range(6):
    grad, end = torch.zeros(256, 256), time.monotonic() + rng.uniform(12.0, 18.0)
    while time.monotonic() < end:  # micro-batches, gradients accumulated locally
        x = torch.randn(64, 256)
        grad += x.t() @ torch.tanh(x @ w) * 1e-6
    dist.all_reduce(grad)
    w -= grad / dist.get_world_size()
dist.destroy_process_group()
