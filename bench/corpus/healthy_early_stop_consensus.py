"""Training with early stopping done right, under torchrun: each rank's stop flag is all_reduced (MAX) every step, so when rank 1's validation says stop, every rank leaves the loop at the same step, destroys the group and exits 0: nothing is wrong.
EXPECT kind=none ranks=3 launch=torchrun class=healthy
"""
import os
import random

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
stop_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(150, 300)
w = torch.zeros(1024)
step = 0
while True:
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    flag = torch.tensor([1.0 if (rank == 1 and step >= stop_step) else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item() > 0:
        print(f"rank {rank}: early stop at step {step}", flush=True)
        break
    step += 1
    time.sleep(0.015)
dist.destroy_process_group()
