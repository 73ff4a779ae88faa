"""Plain loop, 3 ranks; every 20 steps the ranks gather their metrics with all_gather_object; once, rank 1's metrics dict holds a lambda (a formatter someone added), which cannot be pickled, so rank 1 raises while the others wait in the gather.
EXPECT kind=rank_failed culprit=1 ranks=3 launch=agent class=object
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
bad = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(3, 7) * 20
w = torch.zeros(256)
for step in range(bad + 400):
    grad = torch.randn(256)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    if step % 20 == 0:
        metrics = {"step": step, "loss": float(w.norm())}
        if rank == 1 and step == bad:
            fault("puts a lambda in the metrics it gathers")
            metrics["fmt"] = lambda v: f"{v:.3f}"
        out = [None] * dist.get_world_size()
        dist.all_gather_object(out, metrics)
    time.sleep(0.015)
dist.destroy_process_group()
