"""DeviceMesh 2x2 (dp x tp), 4 ranks, healthy: tensor-parallel then data-parallel all_reduce at every step.
EXPECT kind=none ranks=4 launch=agent class=healthy
"""
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
dp, tp = mesh.get_group("dp"), mesh.get_group("tp")
w = torch.randn(64, 64) * 0.01

for step in range(500):
    partial = torch.randn(8, 64) @ w
    dist.all_reduce(partial, group=tp)
    grad = partial.t() @ torch.randn(8, 64)
    dist.all_reduce(grad, group=dp)
    w -= 1e-4 * grad
    time.sleep(0.015)
dist.destroy_process_group()
