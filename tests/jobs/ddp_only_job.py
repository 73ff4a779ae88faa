"""A job whose only collectives are DDP's gradient all-reduces (issued from C++ by the reducer).

``argv[1]`` steps, ``argv[2]`` seconds of sleep after each. Run with ``PGDASH_DDP_HOOK=0`` the
agent leaves DDP alone and sees its all-reduces only through PyTorch's Flight Recorder; no
Python collective runs before the last step, so the page's collectives are all C++-issued.
"""

import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from pgdash_agent import attach

steps, pause = int(sys.argv[1]), float(sys.argv[2])
attach()
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)),
            bucket_cap_mb=0.01)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(steps):
    loss = model(torch.randn(8, 32)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(pause)
dist.destroy_process_group()
