"""Plain all_reduce training under torchrun with no signal handling; after a while the user cancels the job (scancel: SIGTERM to every rank), and every rank dies of it: nobody is at fault.
EXPECT kind=none ranks=3 launch=torchrun class=healthy stop_after=5 stop=sigterm
"""
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
w = torch.zeros(512)
for step in range(100000):
    if step == 100 and rank == 0:
        print(f"MARK {time.time():.6f}", flush=True)
    grad = torch.randn(512)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
