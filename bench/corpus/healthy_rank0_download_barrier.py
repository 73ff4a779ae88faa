"""DDP-style start, 3 ranks under torchrun; rank 0 alone downloads the dataset (about 25 s) while the others wait at a barrier, the pattern of most training scripts; then training runs cleanly.
EXPECT kind=none ranks=3 launch=torchrun class=healthy tolerate=stall
"""
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 0:
    time.sleep(25)  # "Downloading ...": the dataset, once per node
dist.barrier()
print(f"MARK {time.time():.6f}", flush=True)
w = torch.zeros(512)
for step in range(400):
    grad = torch.randn(512)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
