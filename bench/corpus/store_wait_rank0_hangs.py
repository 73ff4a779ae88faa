"""Plain loop, 3 ranks under torchrun; every epoch rank 0 alone prepares the next shard list and publishes it through the job's TCPStore (`store.set`), while the others block in `store.get` for it; in one epoch rank 0 gets stuck preparing (a listing that never returns), so ranks 1 and 2 wait in the store with no collective in flight.
EXPECT kind=hang culprit=0 ranks=3 launch=torchrun class=hang
"""
import datetime
import os
import random
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
store = dist.distributed_c10d._get_default_store()
store.set_timeout(datetime.timedelta(seconds=600))
stuck_epoch = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(4, 9)
w = torch.zeros(512)

for epoch in range(stuck_epoch + 20):
    if rank == 0:
        if epoch == stuck_epoch:
            fault("rank 0 gets stuck listing the next epoch's shards")
            while True:  # a listing of a bucket that never returns
                time.sleep(1)
        store.set(f"shards/{epoch}", ",".join(str(i) for i in range(epoch, epoch + 8)))
    shards = store.get(f"shards/{epoch}").decode().split(",")
    for step in range(len(shards) * 3):
        grad = torch.randn(512)
        dist.all_reduce(grad)
        w -= 0.01 * grad
        time.sleep(0.01)
dist.destroy_process_group()
