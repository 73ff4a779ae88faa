"""Ranks started under torchrun; rank 2 raises before init_process_group (its node's config file lacks a key), so ranks 0 and 1 wait in the rendezvous until torchrun stops them.
EXPECT kind=rank_failed|init_incomplete culprit=2 ranks=3 launch=torchrun class=init
"""
import os
import time

import torch
import torch.distributed as dist

config = {"lr": 0.01, "batch_size": 32}
if os.environ.get("RANK") == "2":
    time.sleep(1.0)
    print(f"FAULT {time.time():.6f} rank 2: its config lacks a key", flush=True)
    config = {"lr": 0.01}
batch_size = config["batch_size"]

dist.init_process_group("gloo")
w = torch.zeros(1024)
for step in range(300):
    grad = torch.randn(batch_size, 1024).mean(0)
    dist.all_reduce(grad)
    w -= config["lr"] * grad
    time.sleep(0.015)
dist.destroy_process_group()
