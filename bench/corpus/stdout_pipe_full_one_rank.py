"""Data parallel, 3 ranks under torchrun; each rank's log lines go to stdout, which a log shipper reads through a pipe. Rank 1's shipper dies, so nobody reads its pipe: once the pipe's 64 KiB are full, rank 1's next print blocks in write(2) forever and ranks 0 and 2 wait for it in the next all_reduce.
EXPECT kind=hang|stall culprit=1 ranks=3 launch=torchrun class=hang
"""
import os
import random
import sys
import time

import torch
import torch.distributed as dist

STUCK = 1

dist.init_process_group("gloo")
rank = dist.get_rank()
dies_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
log = sys.stdout
g = torch.zeros(2048)
for step in range(dies_at + 400):
    if rank == STUCK and step == dies_at:
        print(f"FAULT {time.time():.6f} rank 1: its log shipper dies; nobody reads its stdout pipe", flush=True)
        read_end, write_end = os.pipe()
        log = os.fdopen(write_end, "w", buffering=1)  # the shipper's pipe, now unread
    g.normal_()
    dist.all_reduce(g)
    print(f"step {step} rank {rank} loss {g[0].item():.4f} " + "x" * 200, file=log, flush=True)
    time.sleep(0.01)
dist.destroy_process_group()
