"""Training under torchrun, 3 ranks; after each epoch every rank evaluates on its own validation shard and, when its validation loss beats the best so far, broadcasts the model from rank 0 to "keep the best weights in sync" -- a condition each rank evaluates on its own shard. Once, only rank 2's loss improves: it alone calls the broadcast while the others go on to the next epoch's gradient all-reduces.
EXPECT kind=desync|hang culprit=2 ranks=3 launch=torchrun class=desync
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
odd_epoch = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(2, 4)
model = torch.zeros(4096)
best = float("inf")
for epoch in range(odd_epoch + 30):
    for step in range(25):
        grad = torch.randn(4096)
        dist.all_reduce(grad)
        model -= 0.001 * grad
        time.sleep(0.01)
    # local validation: every rank's loss falls until odd_epoch, where only rank 2's does
    val_loss = 10.0 - epoch if epoch < odd_epoch or rank == 2 and epoch == odd_epoch \
        else 10.0 - odd_epoch + 1
    if val_loss < best:
        best = val_loss
        if epoch == odd_epoch:
            fault("only rank 2's validation loss improved: it alone broadcasts the model")
        dist.broadcast(model, src=0)
dist.destroy_process_group()
