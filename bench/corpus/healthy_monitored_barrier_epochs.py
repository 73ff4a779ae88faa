"""Plain all_reduce training, 3 ranks under torchrun; at the end of each 60-step epoch rank 0 saves a checkpoint (1.5 s) and every rank then meets at dist.monitored_barrier (gloo's barrier that names missing ranks), with a 30 s timeout. Nothing is wrong.
EXPECT kind=none ranks=3 launch=torchrun class=healthy
"""
import datetime
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
w = torch.zeros(1024)
print(f"MARK {time.time():.6f}", flush=True)
for epoch in range(6):
    for step in range(60):
        grad = torch.randn(1024)
        dist.all_reduce(grad)
        w -= 0.01 * grad
        time.sleep(0.02)
    if rank == 0:
        time.sleep(1.5)  # torch.save(checkpoint)
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
dist.destroy_process_group()
