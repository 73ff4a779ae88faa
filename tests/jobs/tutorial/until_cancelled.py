"""Training that runs until it is cancelled: an all-reduce of gradients each step, then a
little compute. Prints ``steps`` once every rank has stepped a few times (rank 0)."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
w = torch.zeros(4096)
for step in range(1_000_000):  # (bounded: an hour and more at this pace)
    grad = torch.randn(4096)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    if step == 20 and rank == 0:
        print("steps", flush=True)
    time.sleep(0.005)
dist.destroy_process_group()
