"""A new user's first try: the training script run under torchrun with one process (--nproc-per-node 1), all_reduce on a world of one, a checkpoint every 200 steps. Nothing is wrong.
EXPECT kind=none ranks=1 launch=torchrun class=healthy
"""
import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
w = torch.zeros(1024)
for step in range(1500):
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
    if step % 200 == 199:
        torch.save({"w": w}, os.devnull)
        time.sleep(2.0)
dist.destroy_process_group()
