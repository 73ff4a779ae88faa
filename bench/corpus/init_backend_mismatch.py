"""3 ranks launched by hand; rank 1's copy of the launch script asks for the "nccl" backend where the others ask for "gloo" (an old config on that node), on hosts with no GPU, so rank 1 fails in init_process_group.
EXPECT kind=init_failed|rank_failed culprit=1 ranks=3 launch=agent class=init
"""
import os
import time

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
backend = "gloo"
if rank == 1:
    backend = "nccl"
    print(f"FAULT {time.time():.6f} rank 1: asks for the nccl backend on a host with no GPU",
          flush=True)
dist.init_process_group(backend)
t = torch.ones(256)
for step in range(300):
    dist.all_reduce(t)
    t /= dist.get_world_size()
    time.sleep(0.015)
dist.destroy_process_group()
