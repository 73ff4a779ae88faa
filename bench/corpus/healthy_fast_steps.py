"""Plain training with a tiny model, 4 ranks under torchrun: each step all-reduces 16 floats and does nothing else, as fast as the ranks can go (a few hundred collectives a second on an oversubscribed 2-core host). Nothing is wrong.
EXPECT kind=none ranks=4 launch=torchrun class=healthy
"""
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
w = torch.zeros(16)
print(f"MARK {time.time():.6f}", flush=True)
for step in range(6000):
    grad = torch.randn(16)
    dist.all_reduce(grad)
    w -= 0.01 * grad
dist.barrier()
dist.destroy_process_group()
