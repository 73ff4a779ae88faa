"""Plain all_reduce training, 4 ranks; every 80 steps rank 0 writes logs and plots for 5-6 s while the others wait in the next all_reduce.
EXPECT kind=none ranks=4 launch=torchrun class=healthy
"""
import os
import random
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")))
log_s = [rng.uniform(5, 6) for _ in range(3)]
history = []
w = torch.zeros(1024)

for step in range(240):
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.001 * grad / world
    history.append(float(grad.norm()))
    time.sleep(0.015)
    if rank == 0 and step % 80 == 79:
        start = time.time()  # histograms, a plot, an upload of the metrics: rank 0 only
        while time.time() - start < log_s[step // 80]:
            torch.histc(torch.tensor(history), bins=50)
            time.sleep(0.02)
        print(f"step {step}: logged in {time.time() - start:.1f} s", flush=True)
dist.destroy_process_group()
