"""DDP training under torchrun with a custom gradient compression comm hook; the hook raises on rank 1 when a bucket holds a NaN (its own check), inside DDP's backward.
EXPECT kind=rank_failed culprit=1 ranks=3 launch=torchrun class=crash
"""
import os
import random
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


def compress_hook(state, bucket):
    grad = bucket.buffer()
    if torch.isnan(grad).any():
        raise RuntimeError(f"compress_hook: NaN in gradient bucket {bucket.index()} "
                           f"on rank {dist.get_rank()}")
    grad.div_(dist.get_world_size())
    fut = dist.all_reduce(grad, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


dist.init_process_group("gloo")
rank = dist.get_rank()
bad_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(40, 120)
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
model.register_comm_hook(None, compress_hook)
opt = torch.optim.SGD(model.parameters(), lr=0.01)

for step in range(bad_step + 300):
    x, y = torch.randn(16, 32), torch.randn(16, 1)
    if rank == 1 and step == bad_step:
        fault("a NaN input makes the comm hook raise")
        x[0, 0] = float("nan")
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.015)
dist.destroy_process_group()
