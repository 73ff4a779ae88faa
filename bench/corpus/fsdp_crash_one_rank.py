"""FSDP2 (fully_shard) training, 3 ranks under torchrun; rank 1's forward raises (a custom layer's assertion on its input), so the others wait in FSDP's all-gather and reduce-scatter.
EXPECT kind=rank_failed culprit=1 ranks=3 launch=torchrun class=crash
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


class Checked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 64)

    def forward(self, x):
        assert torch.isfinite(x).all(), "Checked.forward: non-finite activations"
        return torch.relu(self.lin(x))


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
bad_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(40, 120)
torch.manual_seed(0)
model = torch.nn.Sequential(Checked(), torch.nn.Linear(64, 4))
for layer in model:
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

for step in range(bad_step + 300):
    x = torch.randn(8, 16)
    if rank == 1 and step == bad_step:
        fault("a non-finite input trips the layer's assertion")
        x[0, 0] = float("inf")
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.01)
dist.destroy_process_group()
