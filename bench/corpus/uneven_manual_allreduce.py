"""Plain data parallel (gradients averaged by hand with dist.all_reduce); rank 0's shard runs out and it goes to the end-of-epoch barrier while the others all-reduce gradients.
EXPECT kind=desync|hang culprit=0 ranks=3 launch=torchrun class=uneven
"""
import os
import random
import time

import torch
import torch.distributed as dist

SHORT = 0


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")))
steps = rng.randint(80, 200) - (rng.randint(2, 6) if rank == SHORT else 0)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(24, 48), torch.nn.ReLU(), torch.nn.Linear(48, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05)

for step in range(steps):
    x, y = torch.randn(32, 24), torch.randint(0, 4, (32,))
    time.sleep(0.01)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    flat = torch.cat([p.grad.flatten() for p in model.parameters()])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for p in model.parameters():
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
    opt.step()
    opt.zero_grad()
if rank == SHORT:
    fault("its data ran out: goes to the end-of-epoch barrier while the others all-reduce "
          "gradients")
dist.barrier()
dist.destroy_process_group()
