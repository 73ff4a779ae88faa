"""DeviceMesh 2x2 (dp x tp); rank 3 breaks out of its loop (its data iterator ended) and the script ends without destroy_process_group, exit 0, while the others go on.
EXPECT kind=rank_exited_early culprit=3 ranks=4 launch=torchrun class=early_exit
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
rank = dist.get_rank()
dp, tp = mesh.get_group("dp"), mesh.get_group("tp")
rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")))
n = rng.randint(60, 160)
data = iter(range(n if rank == 3 else 100_000))
w = torch.randn(64, 64) * 0.01

for step in range(1000):
    try:
        next(data)
    except StopIteration:
        fault("its data iterator ended: leaves the loop, the script returns, exit 0")
        break
    partial = torch.randn(8, 64) @ w
    dist.all_reduce(partial, group=tp)  # tensor parallel: partial sums of a layer
    grad = partial.t() @ torch.randn(8, 64)
    dist.all_reduce(grad, group=dp)  # data parallel: gradients
    w -= 1e-4 * grad
    time.sleep(0.01)
