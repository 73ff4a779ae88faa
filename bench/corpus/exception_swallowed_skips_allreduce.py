"""Plain loop, 3 ranks; each step is wrapped in `try/except Exception: log and continue`; once, rank 1's data augmentation raises, the handler skips the rest of its step (its all_reduce), and from then on rank 1 is one collective behind the others: it runs out of steps first and exits while they wait in their last all_reduce, about 6 s after the skipped step (nothing shows before: every rank is in an all_reduce, one number apart).
EXPECT kind=rank_exited_early|hang|desync culprit=1 ranks=3 launch=agent class=exit goal=10
"""
import os
import random
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


def augment(x, step, bad):
    if dist.get_rank() == 1 and step == bad:
        fault("augmentation raises; the handler skips the rest of the step")
        raise ValueError("crop larger than the image")
    return x * 1.01


dist.init_process_group("gloo")
rank = dist.get_rank()
bad = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.zeros(256)
for step in range(bad + 300):
    try:
        x = augment(torch.randn(256), step, bad)
        dist.all_reduce(x)
        w -= 0.01 * x
    except Exception as e:
        print(f"rank {rank}: step {step} skipped: {e}", flush=True)
        continue
    time.sleep(0.015)
print(f"rank {rank}: done", flush=True)
dist.destroy_process_group()
