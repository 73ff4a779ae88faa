"""3 ranks launched by hand with init_process_group(timeout=8 s); rank 2's node is slow to start it (a cold import cache: 20 s before it reaches init_process_group), so rank 0's store gives up waiting for it and the others' rendezvous fail before rank 2 arrives.
EXPECT kind=init_incomplete|init_failed culprit=2 ranks=3 launch=agent class=init
"""
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

if os.environ["RANK"] == "2":
    print(f"FAULT {time.time():.6f} rank 2: its imports take 20 s on a cold cache", flush=True)
    time.sleep(20)
dist.init_process_group("gloo", timeout=timedelta(seconds=8))
t = torch.ones(8)
for step in range(200):
    dist.all_reduce(t)
    time.sleep(0.015)
dist.destroy_process_group()
