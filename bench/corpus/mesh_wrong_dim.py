"""2x2 mesh (dp x tp) built with new_group, 4 ranks under torchrun; at one step rank 3 reduces its gradients over its tensor-parallel group where every rank reduces over its data-parallel group (a wrong mesh dimension in a branch only it takes).
EXPECT kind=desync|hang culprit=3 ranks=4 launch=torchrun class=desync
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
tp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
tp, dp = tp_groups[rank // 2], dp_groups[rank % 2]
odd_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
x = torch.randn(256)
for step in range(odd_step + 400):
    y = x.clone()
    dist.all_reduce(y, group=tp)  # the row-parallel layer's output
    grad = torch.randn(256)
    if rank == 3 and step == odd_step:
        fault("reduces its gradients over the tensor-parallel group instead of data-parallel")
        dist.all_reduce(grad, group=tp)
    else:
        dist.all_reduce(grad, group=dp)
    x -= 0.001 * grad
    time.sleep(0.015)
dist.destroy_process_group()
