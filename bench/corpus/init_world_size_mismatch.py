"""3 ranks launched by hand; rank 2 overrides WORLD_SIZE from a stale environment file (4 instead of 3) before init_process_group, so it waits for a fourth rank that will never come.
EXPECT kind=config_mismatch culprit=2 ranks=3 launch=agent class=init
"""
import os
import time

import torch
import torch.distributed as dist

if os.environ["RANK"] == "2":
    print(f"FAULT {time.time():.6f} rank 2: WORLD_SIZE=4 from a stale env file", flush=True)
    os.environ["WORLD_SIZE"] = "4"
dist.init_process_group("gloo")
t = torch.ones(8)
for step in range(200):
    dist.all_reduce(t)
    time.sleep(0.015)
dist.destroy_process_group()
