"""Plain data parallel, 3 ranks under torchrun, overlapping communication with compute: each step issues the gradient all_reduce with async_op=True, computes the next batch's forward for ~0.3 s, then waits on the work; a metric all_gather_object every 100 steps. Nothing is wrong.
EXPECT kind=none ranks=3 launch=torchrun class=healthy
"""
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
w = torch.zeros(4096)
for step in range(150):
    grad = torch.randn(4096)
    work = dist.all_reduce(grad, async_op=True)
    x = torch.randn(256, 256)
    deadline = time.time() + 0.3
    while time.time() < deadline:  # the next batch's forward meanwhile
        x = torch.tanh(x @ x.T / 256)
    work.wait()
    w -= 0.01 * grad
    if step % 100 == 99:
        seen = [None] * dist.get_world_size()
        dist.all_gather_object(seen, {"rank": rank, "step": step})
dist.destroy_process_group()
