"""Plain all_reduce training, 3 ranks under torchrun; nothing goes wrong, but after a while the user presses Ctrl-C (SIGINT to torchrun and every rank) to stop the run: no rank is at fault.
EXPECT kind=none ranks=3 launch=torchrun class=healthy stop_after=5 stop=sigint
"""
import os
import random
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
quit_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(150, 300)
w = torch.zeros(1024)

for step in range(quit_step + 2000):
    if rank == 0 and step == quit_step:
        print(f"MARK {time.time():.6f} rank 0: the user presses Ctrl-C 5 s from now", flush=True)
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.001 * grad
    time.sleep(0.015)
dist.destroy_process_group()
