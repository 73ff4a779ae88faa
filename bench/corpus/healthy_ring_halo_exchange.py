"""A domain-decomposed simulation, 4 ranks under torchrun: every step each rank exchanges halo rows with its two ring neighbours (isend/irecv to both, then wait on all four), updates its block, and every 25 steps all-reduces a residual. Nothing is wrong.
EXPECT kind=none ranks=4 launch=torchrun class=healthy
"""
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
left, right = (rank - 1) % world, (rank + 1) % world
block = torch.randn(64, 256)
print(f"MARK {time.time():.6f}", flush=True)
for step in range(300):
    from_left, from_right = torch.empty(256), torch.empty(256)
    reqs = [dist.isend(block[0].clone(), left), dist.isend(block[-1].clone(), right),
            dist.irecv(from_left, left), dist.irecv(from_right, right)]
    for req in reqs:
        req.wait()
    block[0] = 0.5 * (block[0] + from_left)
    block[-1] = 0.5 * (block[-1] + from_right)
    if step % 25 == 24:
        residual = block.abs().mean().reshape(1)
        dist.all_reduce(residual)
    time.sleep(0.015)
dist.destroy_process_group()
