"""Plain loop, 3 ranks under torchrun; after a short warmup rank 0 broadcasts a large set of pretrained weights (about 1 GB over gloo, several seconds in one collective that every rank is in), then training goes on cleanly.
EXPECT kind=none ranks=3 launch=torchrun class=healthy
"""
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
w = torch.zeros(512)
for step in range(60):
    grad = torch.randn(512)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
print(f"MARK {time.time():.6f}", flush=True)
weights = [torch.randn(64 * 2**20) if rank == 0 else torch.empty(64 * 2**20) for _ in range(4)]
for tensor in weights:  # 4 x 256 MB
    dist.broadcast(tensor, src=0)
del weights
for step in range(400):
    grad = torch.randn(512)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
