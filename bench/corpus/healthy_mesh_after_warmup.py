"""DeviceMesh training, 4 ranks under torchrun: a warm-up on the whole job, then every rank builds the same (2, 2) mesh with init_device_mesh and trains with tensor- and data-parallel all_reduces, and a second, 1-D mesh for evaluation every 50 steps. Nothing is wrong.
EXPECT kind=none ranks=4 launch=torchrun class=healthy
"""
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

dist.init_process_group("gloo")
print(f"MARK {time.time():.6f}", flush=True)
g = torch.zeros(1024)
for step in range(60):
    g.normal_()
    dist.all_reduce(g)
    time.sleep(0.015)
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
dp, tp = mesh.get_group("dp"), mesh.get_group("tp")
flat = init_device_mesh("cpu", (4,), mesh_dim_names=("eval",)).get_group("eval")
w = torch.randn(64, 64) * 0.01
for step in range(250):
    partial = torch.randn(8, 64) @ w
    dist.all_reduce(partial, group=tp)
    grad = partial.t() @ torch.randn(8, 64)
    dist.all_reduce(grad, group=dp)
    w -= 1e-4 * grad
    if step % 50 == 49:
        dist.all_reduce(torch.ones(1), group=flat)
    time.sleep(0.015)
dist.destroy_process_group()
