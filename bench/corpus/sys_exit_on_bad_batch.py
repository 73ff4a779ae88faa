"""Plain all_reduce training, 3 ranks; rank 1's input check finds a corrupt batch and calls sys.exit(3) (no traceback printed), while the others go on into the next all_reduce.
EXPECT kind=rank_failed|rank_exited_early culprit=1 ranks=3 launch=torchrun class=crash
"""
import os
import random
import sys
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


def check(batch, step, bad_step):
    if dist.get_rank() == 1 and step == bad_step:
        fault("sys.exit(3) on a corrupt batch")
        print("corrupt batch: shard 17 has a truncated record, giving up", file=sys.stderr)
        sys.exit(3)


dist.init_process_group("gloo")
bad_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.zeros(1024)
for step in range(bad_step + 400):
    batch = torch.randn(1024)
    check(batch, step, bad_step)
    dist.all_reduce(batch)
    w -= 0.001 * batch
    time.sleep(0.015)
dist.destroy_process_group()
