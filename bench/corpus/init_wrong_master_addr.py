"""Ranks started by hand; rank 2's node has a stale MASTER_ADDR in its environment (an address nothing answers on), so it never reaches the store while ranks 0 and 1 wait in the rendezvous.
EXPECT kind=config_mismatch|init_incomplete culprit=2 ranks=3 launch=agent class=init
"""
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

if os.environ.get("RANK") == "2":
    print(f"FAULT {time.time():.6f} rank 2: MASTER_ADDR is stale", flush=True)
    os.environ["MASTER_ADDR"] = "10.255.255.1"

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
w = torch.zeros(1024)
for step in range(300):
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
