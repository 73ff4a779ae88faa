"""Training with a validation pass after each epoch that all-reduces each validation batch's
loss; the validation set is split by rank in slices of ceil(n / world) without padding, so with
4 batches and 3 ranks the last rank's slice is empty: it skips validation and all-reduces its
next gradients (2,048 floats) while the others all-reduce a loss (one float)."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
val = list(range(4))
per_rank = -(-len(val) // world)
mine = val[rank * per_rank:(rank + 1) * per_rank]
w = torch.zeros(2048)
for epoch in range(3):
    for step in range(30):
        grad = torch.randn(2048)
        dist.all_reduce(grad)
        w -= 0.01 * grad
        time.sleep(0.01)
    for batch in mine:
        loss = torch.tensor([float(batch)])
        dist.all_reduce(loss)
dist.destroy_process_group()
