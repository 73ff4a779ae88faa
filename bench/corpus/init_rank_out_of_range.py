"""3 ranks launched by hand; a launcher script numbers processes from 1, so the process meant to be rank 2 is started with RANK=3 in a world of 3: its init_process_group raises, and the others wait for a rank 2 that never comes.
EXPECT kind=init_failed|config_mismatch|init_incomplete culprit=2 ranks=3 launch=agent class=init
"""
import os
import time

import torch
import torch.distributed as dist

if os.environ["RANK"] == "2":
    print(f"FAULT {time.time():.6f} rank 2: starts with RANK=3 in a world of 3", flush=True)
    os.environ["RANK"] = "3"
dist.init_process_group("gloo")
t = torch.ones(8)
for step in range(200):
    dist.all_reduce(t)
    time.sleep(0.015)
dist.destroy_process_group()
