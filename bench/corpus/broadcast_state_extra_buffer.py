"""Plain training, 3 ranks under torchrun; after every 40 steps rank 0's weights are broadcast to the others tensor by tensor (a hand-written model sync over the model's state_dict). Rank 2 built its model with an extra buffer (a config flag read from its own environment turned on a running-mean norm), so its state_dict holds one tensor more: it calls one broadcast more than the others, with a size they never send.
EXPECT kind=desync|hang|rank_lost culprit=2 ranks=3 launch=torchrun class=desync
"""
import os
import random
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
norm_stats = rank == 2  # read from an environment the launcher set differently on its node
model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
if norm_stats:
    model.register_buffer("running_mean", torch.zeros(32))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
sync_every = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
for step in range(1, 2000):
    loss = model(torch.randn(8, 32)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    if step % sync_every == 0:
        if rank == 2:
            fault(f"syncs {len(model.state_dict())} tensors where the others sync {len(model.state_dict()) - 1}")
        for name, tensor in model.state_dict().items():
            dist.broadcast(tensor, src=0)
    time.sleep(0.015)
dist.destroy_process_group()
