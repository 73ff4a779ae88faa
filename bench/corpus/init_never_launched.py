"""4 ranks, one process per rank; rank 3 is never launched (its node never came up), so the rendezvous waits for it.
EXPECT kind=init_incomplete culprit=3 ranks=4 launch=agent class=init absent=3
"""
import os
import time

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
if rank == 0:  # the runner never starts rank 3 (absent=3): the fault begins with rendezvous
    print(f"FAULT {time.time():.6f} rank {rank}: rendezvous begins; rank 3 was never launched",
          flush=True)
dist.init_process_group("gloo")
t = torch.ones(8)
for _ in range(50):
    dist.all_reduce(t)
dist.destroy_process_group()
