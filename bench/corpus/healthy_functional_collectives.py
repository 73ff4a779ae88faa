"""Tensor-parallel style training, 3 ranks under torchrun: each step's forward sums the ranks' partial activations with torch.distributed.nn.functional.all_reduce, whose backward all-reduces the gradient, and every rank runs backward every step. Nothing is wrong.
EXPECT kind=none ranks=3 launch=torchrun class=healthy
"""
import time

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dfn

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
w = torch.randn(256, 256, requires_grad=True)
opt = torch.optim.SGD([w], lr=1e-4)
print(f"MARK {time.time():.6f}", flush=True)
for step in range(350):
    x = torch.randn(32, 256)
    full = dfn.all_reduce(x @ w)
    loss = full.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.01)
dist.barrier()
dist.destroy_process_group()
