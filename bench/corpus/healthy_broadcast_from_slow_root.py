"""Plain all_reduce training, 3 ranks under torchrun; every 50 steps rank 1 (the data coordinator, not rank 0) reads the next shard's index from disk (0.4 s) and broadcasts it from src=1, so ranks 0 and 2 wait for it in that broadcast. Nothing is wrong.
EXPECT kind=none ranks=3 launch=torchrun class=healthy
"""
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
w = torch.zeros(1024)
print(f"MARK {time.time():.6f}", flush=True)
for step in range(1, 501):
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    if step % 50 == 0:
        index = torch.zeros(256, dtype=torch.int64)
        if rank == 1:
            time.sleep(0.4)  # read the shard index
            index += step
        dist.broadcast(index, src=1)
    time.sleep(0.015)
dist.destroy_process_group()
