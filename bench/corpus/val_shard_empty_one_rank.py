"""Plain all_reduce training, 4 ranks under torchrun, with a validation pass every epoch that all-reduces each batch's loss sum; the validation set is split by rank without padding, and rank 3's slice is empty (9 batches in slices of 3), so rank 3 skips the validation loop and goes straight into the next epoch's gradient all_reduce while the others all-reduce validation losses.
EXPECT kind=desync|hang culprit=3 ranks=4 launch=torchrun class=uneven
"""
import os
import random
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
steps_per_epoch = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
val_batches = list(range(9))  # 9 validation batches, split 3/2/2/2... by a careless slice
per_rank = -(-len(val_batches) // world)  # ceil: 3 each, so rank 3's slice starts past the end
mine = val_batches[rank * per_rank:(rank + 1) * per_rank]
w = torch.zeros(2048)
for epoch in range(100):
    for step in range(steps_per_epoch):
        grad = torch.randn(2048)
        dist.all_reduce(grad)
        w -= 0.01 * grad / world
        time.sleep(0.015)
    if not mine:
        fault("has no validation batches: skips validation")
    for batch in mine:
        loss = torch.tensor([float(batch)])
        dist.all_reduce(loss)  # the others' validation all_reduce
dist.destroy_process_group()
