"""Plain all_reduce training, 3 ranks under torchrun; rank 1's error handler (a bad batch caught by a try/except meant for the end of training) calls dist.destroy_process_group() and then goes on with the loop, computing without collectives (it skips them: `if dist.is_initialized()`), while ranks 0 and 2 wait for it in all_reduce.
EXPECT kind=hang|rank_exited_early culprit=1 ranks=3 launch=torchrun class=hang
"""
import os
import random
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
bad_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(80, 200)
w = torch.zeros(1024)
for step in range(bad_step + 3000):
    grad = torch.randn(1024)
    try:
        if rank == 1 and step == bad_step:
            raise ValueError("bad batch: empty sequence")
    except ValueError:
        print(f"FAULT {time.time():.6f} rank {rank}: its error handler destroys the process "
              "group, and the loop goes on", flush=True)
        dist.destroy_process_group()
    if dist.is_initialized():
        dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
if dist.is_initialized():
    dist.destroy_process_group()
