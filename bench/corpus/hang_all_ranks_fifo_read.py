"""Plain loop, 3 ranks under torchrun; every rank reads its next shard list from a named pipe a data service should feed (a sidecar that died): every rank blocks in open(), outside any collective, using no CPU.
EXPECT kind=hang culprit=0,1,2 ranks=3 launch=torchrun class=hang
"""
import os
import random
import tempfile
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
folder = os.path.join(tempfile.gettempdir(), f"corpus-fifo-{os.environ.get('PGDASH_JOB', 'x')}")
os.makedirs(folder, exist_ok=True)
pipe = os.path.join(folder, f"shards-{rank}")
if not os.path.exists(pipe):
    os.mkfifo(pipe)
stuck = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.zeros(512)
for step in range(stuck + 400):
    if step == stuck:
        if rank == 0:
            fault("the data service that feeds every rank's shard pipe has died")
        with open(pipe) as f:  # blocks until a writer opens it: none will
            shards = f.read().split()
    grad = torch.randn(512)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
