"""Plain all_reduce training, 3 ranks under torchrun; for about 15 s in the middle every rank's steps take five times longer (the shared file system the data loader reads from slows down for everyone alike), then speed back up. No rank is at fault.
EXPECT kind=none ranks=3 launch=torchrun class=healthy
"""
import os
import random
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")))
slow_from = rng.randint(100, 200)
print(f"MARK {time.time():.6f}", flush=True)
t = torch.ones(2048)
for step in range(slow_from + 300):
    dist.all_reduce(t)
    t /= dist.get_world_size()
    slow = slow_from <= step < slow_from + 150
    time.sleep(0.1 + 0.005 * random.random() if slow else 0.02)
dist.destroy_process_group()
