"""3 ranks started by hand; rank 1 reads MASTER_PORT from yesterday's job file (a port nobody listens on), so it never reaches the store rank 0 serves, and the rendezvous waits for it.
EXPECT kind=config_mismatch|init_failed|init_incomplete culprit=1 ranks=3 launch=agent class=init
"""
import os
import time

import torch
import torch.distributed as dist

if os.environ["RANK"] == "1":
    print(f"FAULT {time.time():.6f} rank 1: MASTER_PORT from a stale job file", flush=True)
    os.environ["MASTER_PORT"] = str(int(os.environ["MASTER_PORT"]) + 1)
dist.init_process_group("gloo")
t = torch.ones(8)
for step in range(200):
    dist.all_reduce(t)
    time.sleep(0.015)
dist.destroy_process_group()
