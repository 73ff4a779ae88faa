"""3 ranks launched by hand (one process per rank, as a home-grown launcher does); the launcher's environment template was copied from rank 1's, so the process meant to be rank 2 starts with RANK=1 too: two processes claim rank 1 and nobody is rank 2; the rendezvous never completes.
EXPECT kind=init_incomplete|config_mismatch culprit=2 ranks=3 launch=agent class=init
"""
import os
import time

import torch
import torch.distributed as dist

if os.environ["RANK"] == "2":
    print(f"FAULT {time.time():.6f} rank 2: starts with RANK=1 (a copied environment)", flush=True)
    os.environ["RANK"] = "1"
dist.init_process_group("gloo")
t = torch.ones(8)
for step in range(200):
    dist.all_reduce(t)
    time.sleep(0.015)
dist.destroy_process_group()
