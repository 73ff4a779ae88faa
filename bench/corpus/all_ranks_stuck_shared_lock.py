"""Plain loop, 3 ranks under torchrun; every rank appends its loss to a shared log file under an exclusive `fcntl` lock; a stray process (a log rotator) takes the lock and never releases it, so every rank blocks in `lockf`, outside any collective.
EXPECT kind=hang culprit=0,1,2 ranks=3 launch=torchrun class=hang
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


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
path = os.path.join(tempfile.gettempdir(), f"corpus-lock-{os.environ.get('PGDASH_JOB', 'x')}.log")
stuck = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.zeros(512)
holder = None
for step in range(stuck + 400):
    grad = torch.randn(512)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    if step == stuck and rank == 0:
        fault("a stray process takes the shared log's lock and never lets go")
        holder = subprocess.Popen([sys.executable, "-c", (
            "import fcntl, sys, time\n"
            f"f = open({path!r}, 'a')\n"
            "fcntl.lockf(f, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "time.sleep(3600)\n")], stdout=subprocess.PIPE)
        holder.stdout.readline()
    dist.barrier()
    with open(path, "a") as f:
        fcntl.lockf(f, fcntl.LOCK_EX)
        f.write(f"{rank} {step} {float(w.norm()):.4f}\n")
        fcntl.lockf(f, fcntl.LOCK_UN)
    time.sleep(0.015)
dist.destroy_process_group()
