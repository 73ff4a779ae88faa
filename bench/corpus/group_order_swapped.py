"""3 ranks, two process groups over all ranks (the default one for gradients, a second gloo group for metrics); once, rank 2's logging callback runs before its gradient all_reduce instead of after it, so rank 2 waits in the metrics group while ranks 0 and 1 wait for it in the default one.
EXPECT kind=hang|desync culprit=2 ranks=3 launch=torchrun class=desync
"""
import os
import random
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
metrics_group = dist.new_group(backend="gloo")
odd_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
grad, loss = torch.ones(1024), torch.ones(1)


def log_metrics():
    dist.all_reduce(loss, group=metrics_group)


for step in range(odd_step + 400):
    swapped = rank == 2 and step == odd_step
    if swapped:
        fault("logs its metrics before the gradient all_reduce")
        log_metrics()
    dist.all_reduce(grad)
    grad /= 3
    if not swapped:
        log_metrics()
    time.sleep(0.015)
dist.destroy_process_group()
