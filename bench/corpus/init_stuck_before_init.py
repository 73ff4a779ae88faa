"""torchrun, 3 ranks; rank 2 waits forever for a dataset lock file before init_process_group, so the rendezvous never completes.
EXPECT kind=init_incomplete culprit=2 ranks=3 launch=torchrun class=init
"""
import os
import time

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
if rank == 2:
    lock = "/nonexistent/pgdash-corpus/dataset.ready"
    print(f"FAULT {time.time():.6f} rank {rank}: waits forever for {lock} before "
          "init_process_group", flush=True)
    while not os.path.exists(lock):
        time.sleep(0.5)
dist.init_process_group("gloo")
t = torch.ones(8)
for _ in range(50):
    dist.all_reduce(t)
dist.destroy_process_group()
