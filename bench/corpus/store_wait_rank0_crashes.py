"""Plain loop, 3 ranks under torchrun; rank 0 alone builds the vocabulary and publishes it through the job's TCPStore while the others block in `store.wait`; rank 0 raises a ValueError while building it.
EXPECT kind=rank_failed culprit=0 ranks=3 launch=torchrun class=crash
"""
import datetime
import os
import random
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


def build_vocab(epoch, bad):
    words = [f"w{i}" for i in range(1000)]
    if epoch == bad:
        fault("rank 0 meets a malformed line while building the vocabulary")
        int("3,5")  # a malformed count in the corpus file
    return len(words)


dist.init_process_group("gloo")
rank = dist.get_rank()
store = dist.distributed_c10d._get_default_store()
store.set_timeout(datetime.timedelta(seconds=600))
bad_epoch = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(3, 8)
w = torch.zeros(512)
for epoch in range(bad_epoch + 10):
    if rank == 0:
        store.set(f"vocab/{epoch}", str(build_vocab(epoch, bad_epoch)))
    store.wait([f"vocab/{epoch}"])
    for step in range(25):
        grad = torch.randn(512)
        dist.all_reduce(grad)
        w -= 0.01 * grad
        time.sleep(0.01)
dist.destroy_process_group()
