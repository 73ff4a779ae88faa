"""Plain all_reduce training, 4 ranks started by hand as 2 nodes of 2; node 1 (ranks 2 and 3) loses power: both processes die at once (SIGKILL), while ranks 0 and 1 wait in all_reduce.
EXPECT kind=rank_lost culprit=2,3 ranks=4 launch=agent class=lost
"""
import os
import random
import signal
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
kill_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.zeros(1024)
for step in range(kill_step + 400):
    if rank in (2, 3) and step == kill_step:
        if rank == 2:
            print(f"FAULT {time.time():.6f} rank 2: node 1 (ranks 2, 3) loses power", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
