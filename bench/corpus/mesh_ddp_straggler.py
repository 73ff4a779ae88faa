"""DeviceMesh 2x2 (dp x tp) with DDP on dp and a tensor-parallel all_reduce per step; from a random step on, rank 3's steps take 30% longer (as in `pgdash demo --scenario straggler`): rank 1 waits for it in DDP's all-reduce, then arrives late in tp, where rank 0 waits for rank 1.
EXPECT kind=straggler culprit=3 ranks=4 launch=agent class=straggler
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP

SLOW, SLOW_STEPS = 3, 120


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
rank = dist.get_rank()
dp, tp = mesh.get_group("dp"), mesh.get_group("tp")
slow_from = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(50, 100)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 8)), process_group=dp)
opt = torch.optim.SGD(model.parameters(), lr=0.01)

for step in range(slow_from + SLOW_STEPS):
    time.sleep(0.1)  # the rest of the step
    if rank == SLOW and step >= slow_from:
        if step == slow_from:
            fault("30 ms late at every step from now on")
        time.sleep(0.03)
    model(torch.randn(32, 64)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    dist.all_reduce(torch.randn(16, 128), group=tp)  # a row-parallel layer's partial sums
    if step % 10 == 0:
        dist.all_reduce(torch.randn(1))  # the logged loss, world-wide
    if rank == SLOW and step >= slow_from:
        print(f"STEP {step - slow_from + 1} {time.time():.6f}", flush=True)
dist.destroy_process_group()
