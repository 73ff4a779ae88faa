"""Data parallel, 3 ranks under torchrun: each step all-reduces its gradient; after the last step rank 1 alone all-reduces a metric it logs (async_op=True, waited before it prints) because its copy of the config enables extra logging; ranks 0 and 2 go on to the job's final barrier, and the three collectives do not match.
EXPECT kind=desync|hang|stall culprit=1 ranks=3 launch=torchrun class=desync
"""
import os
import random
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
steps = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(80, 200)
g = torch.zeros(4096)
for step in range(steps):
    g.normal_()
    dist.all_reduce(g)
    time.sleep(0.015)
if rank == 1:
    print(f"FAULT {time.time():.6f} rank 1: all-reduces a metric only it logs", flush=True)
    metric = torch.tensor([float(steps)])
    work = dist.all_reduce(metric, async_op=True)
    work.wait()
    print(f"rank 1 mean metric {metric.item() / 3:.2f}", flush=True)
dist.barrier()
dist.destroy_process_group()
