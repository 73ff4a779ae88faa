"""Plain all_reduce training, 4 ranks under torchrun; ranks 2 and 3 read their shards from the same NFS server, which stops answering: both block forever in a read, while ranks 0 and 1 wait in all_reduce.
EXPECT kind=hang culprit=2,3 ranks=4 launch=torchrun class=hang
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
bad_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.zeros(1024)
for step in range(bad_step + 400):
    if rank in (2, 3) and step == bad_step:
        if rank == 2:
            fault("ranks 2 and 3 block in a read from a dead NFS server")
        while True:
            time.sleep(1)
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
