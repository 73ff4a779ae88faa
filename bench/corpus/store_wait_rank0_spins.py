"""Plain loop, 3 ranks under torchrun; at each epoch rank 0 alone deduplicates the next shard list and publishes it through the job's TCPStore while the others block in `store.wait`; once, rank 0's deduplication never ends (a loop whose exit condition a bad record never meets), spinning on the CPU.
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


def dedup(records, bad):
    seen, out, i = set(), [], 0
    while i < len(records):
        if records[i] not in seen:
            seen.add(records[i])
            out.append(records[i])
            i += 1
        elif not bad:
            i += 1
        # (bad: a duplicate never advances i)
    return out


dist.init_process_group("gloo")
rank = dist.get_rank()
store = dist.distributed_c10d._get_default_store()
store.set_timeout(datetime.timedelta(seconds=600))
bad_epoch = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(4, 9)
w = torch.zeros(512)
for epoch in range(bad_epoch + 20):
    if rank == 0:
        if epoch == bad_epoch:
            fault("rank 0's deduplication meets a duplicate record and never ends")
        records = [f"s{i % 7}" for i in range(20)]
        store.set(f"shards/{epoch}", ",".join(dedup(records, epoch == bad_epoch)))
    store.wait([f"shards/{epoch}"])
    for step in range(25):
        grad = torch.randn(512)
        dist.all_reduce(grad)
        w -= 0.01 * grad
        time.sleep(0.01)
dist.destroy_process_group()
