"""Plain all_reduce training, 3 ranks under torchrun, with a "resilient" step: each all_reduce is retried up to 20 times, a second apart, when it raises. Rank 2 raises a ValueError on a corrupt sample and dies; ranks 0 and 1 then retry their all_reduce again and again, each retry failing, before they give up.
EXPECT kind=rank_failed culprit=2 ranks=3 launch=torchrun class=crash
"""
import os
import random
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


def resilient_all_reduce(t):
    for attempt in range(20):
        try:
            dist.all_reduce(t)
            return
        except RuntimeError as exc:
            print(f"rank {dist.get_rank()}: all_reduce failed ({exc}); retry {attempt + 1}",
                  flush=True)
            time.sleep(1.0)
    raise RuntimeError("all_reduce failed 20 times")


dist.init_process_group("gloo")
rank = dist.get_rank()
bad = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.zeros(1024)
for step in range(bad + 400):
    if rank == 2 and step == bad:
        fault("raises ValueError on a corrupt sample")
        raise ValueError(f"sample {step * 32 + 7}: label -1 out of range [0, 1000)")
    grad = torch.randn(1024)
    resilient_all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
