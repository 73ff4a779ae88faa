"""DeviceMesh training, 4 ranks under torchrun: after a warm-up on the whole job each rank builds its (dp, tp) mesh with init_device_mesh from a tp size it reads from its node's config file; rank 3's node still has the old file (tp=1, so mesh (4, 1)) where the others read tp=2 (mesh (2, 2)). The meshes make different groups, and the job never gets past them.
EXPECT kind=desync|hang|stall culprit=3 ranks=4 launch=torchrun class=desync
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
switch = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
g = torch.zeros(1024)
for step in range(switch):
    g.normal_()
    dist.all_reduce(g)
    time.sleep(0.015)
tp_size = 1 if rank == 3 else 2  # the node's config file
if rank == 3:
    print(f"FAULT {time.time():.6f} rank 3: builds a ({world}, 1) mesh where the others build (2, 2)", flush=True)
mesh = init_device_mesh("cpu", (world // tp_size, tp_size), mesh_dim_names=("dp", "tp"))
dp, tp = mesh.get_group("dp"), mesh.get_group("tp")
w = torch.randn(64, 64) * 0.01
for step in range(300):
    partial = torch.randn(8, 64) @ w
    dist.all_reduce(partial, group=tp)
    grad = partial.t() @ torch.randn(8, 64)
    dist.all_reduce(grad, group=dp)
    w -= 1e-4 * grad
    time.sleep(0.015)
dist.destroy_process_group()
