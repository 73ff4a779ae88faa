"""Plain data parallel, 3 ranks under torchrun, gradients in four buckets: each step issues the four all_reduces with async_op=True (as a hand-written DDP would, one per bucket), then waits on them in reverse order, newest first. Nothing is wrong.
EXPECT kind=none ranks=3 launch=torchrun class=healthy
"""
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
buckets = [torch.zeros(n) for n in (4096, 1024, 8192, 256)]
print(f"MARK {time.time():.6f}", flush=True)
for step in range(400):
    grads = [torch.randn(b.numel()) for b in buckets]
    works = [dist.all_reduce(g, async_op=True) for g in grads]
    for work in reversed(works):
        work.wait()
    for b, g in zip(buckets, grads):
        b -= 0.01 * g
    time.sleep(0.02)
dist.destroy_process_group()
