"""Plain all_reduce training, ranks started by hand; rank 2's node is slow to start (a cold filesystem: its imports take 12 s), so the rendezvous waits for it, then training runs normally to the end: nothing is wrong.
EXPECT kind=none ranks=3 launch=agent class=healthy tolerate=init_incomplete
"""
import os
import time

import torch
import torch.distributed as dist

if os.environ.get("RANK") == "2":
    time.sleep(12)  # imports from a cold network filesystem

dist.init_process_group("gloo")
rank = dist.get_rank()
w = torch.zeros(1024)
for step in range(400):
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
