"""Plain all_reduce training, 3 ranks under torchrun; after a few hundred steps rank 0 alone evaluates with a DataLoader of two worker processes while ranks 1 and 2 wait for it at dist.barrier(); the evaluation set's reader takes a lock on a shared index file that a stray process holds forever, so both workers block (no CPU, no I/O) and rank 0 waits for their batches forever. (Goal 31 s: a wait at a barrier is a stall only after stall_barrier_after, 30 s, as rank-0 saves and evaluations are long, plus the judgement that sees it; rank 0 using no CPU and moving no data could be named sooner, which a healthy rank 0 waiting on a slow upload would pay for.)
EXPECT kind=hang culprit=0 ranks=3 launch=torchrun class=hang goal=31
"""
import fcntl
import os
import random
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

INDEX = os.path.join(tempfile.gettempdir(), f"corpus-eval-index-{os.getppid()}.lock")


class ValSet(Dataset):
    def __len__(self):
        return 10**6

    def __getitem__(self, i):
        with open(INDEX, "a") as f:
            fcntl.lockf(f, fcntl.LOCK_EX)  # blocks: the stray process holds it
            fcntl.lockf(f, fcntl.LOCK_UN)
        return torch.randn(256)


dist.init_process_group("gloo")
rank = dist.get_rank()
eval_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(150, 300)
w = torch.randn(256, 256) * 0.01
holder = None
for step in range(eval_step + 200):
    if step == eval_step:
        if rank == 0:
            holder = subprocess.Popen([sys.executable, "-c", (
                "import fcntl, sys, time\n"
                f"f = open({INDEX!r}, 'a')\n"
                "fcntl.lockf(f, fcntl.LOCK_EX)\n"
                "print('locked', flush=True)\n"
                "time.sleep(3600)\n")], stdout=subprocess.PIPE)
            holder.stdout.readline()
            print(f"FAULT {time.time():.6f} rank 0: its evaluation loader's workers block on "
                  "a lock a stray process holds", flush=True)
            for batch in DataLoader(ValSet(), batch_size=16, num_workers=2):
                w -= 0.0 * batch.mean()
                break
        dist.barrier()
    grad = torch.randn(256, 256) * 0.001
    dist.all_reduce(grad)
    w -= grad
    time.sleep(0.015)
dist.destroy_process_group()
