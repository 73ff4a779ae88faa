"""DeviceMesh 2x2 (dp x tp); rank 1 freezes before its tensor-parallel all_reduce: rank 0 waits in tp, rank 3 in dp, rank 2 behind them.
EXPECT kind=hang culprit=1 ranks=4 launch=torchrun class=hang
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

STUCK = 1


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
rank = dist.get_rank()
dp, tp = mesh.get_group("dp"), mesh.get_group("tp")
stuck_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.randn(64, 64) * 0.01

for step in range(stuck_at + 500):
    partial = torch.randn(8, 64) @ w
    if rank == STUCK and step == stuck_at:
        fault("freezes before its tensor-parallel all_reduce")
        while True:
            time.sleep(1)
    dist.all_reduce(partial, group=tp)
    grad = partial.t() @ torch.randn(8, 64)
    dist.all_reduce(grad, group=dp)
    w -= 1e-4 * grad
    time.sleep(0.015)
dist.destroy_process_group()
