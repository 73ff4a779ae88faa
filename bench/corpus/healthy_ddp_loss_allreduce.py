"""DDP, 4 ranks, plus a Python all_reduce of the loss at every step for logging.
EXPECT kind=none ranks=4 launch=torchrun class=healthy
"""
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

for step in range(400):
    time.sleep(0.01)
    loss = model(torch.randn(16, 32)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss)
    if rank == 0 and step % 100 == 0:
        print(f"step {step} loss {mean_loss.item() / world:.4f}", flush=True)
dist.destroy_process_group()
