"""Plain training, 3 ranks under torchrun; every 50 steps rank 0 broadcasts the run's settings with broadcast_object_list. After a refactor rank 0 sends a list of 2 objects (settings, schedule) while the others still pass a list of 3 placeholders, so the sizes of the object-size broadcast disagree.
EXPECT kind=desync|rank_failed|rank_lost|hang culprit=0 ranks=3 launch=torchrun class=object
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
refactor = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(2, 4) * 50
w = torch.zeros(1024)
for step in range(refactor + 400):
    if step % 50 == 0:
        if rank == 0:
            objs = [{"lr": 0.01, "step": step}, [0.1] * 4]
            if step < refactor:
                objs.append("v1")
            elif step == refactor:
                fault("broadcasts a list of 2 objects where the others expect 3")
        else:
            objs = [None, None, None]
        dist.broadcast_object_list(objs, src=0)
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
