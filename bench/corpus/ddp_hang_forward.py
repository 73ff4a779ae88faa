"""DDP, 3 ranks; rank 1 freezes in its forward, so the others wait inside DDP's C++ all-reduce (only the Flight Recorder sees it).
EXPECT kind=hang culprit=1 ranks=3 launch=agent class=hang
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

STUCK = 1


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 64), torch.nn.Linear(64, 1)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if dist.get_rank() == STUCK and self.calls == stuck_at:
            fault("freezes in its forward")
            while True:
                time.sleep(1)
        return self.b(torch.relu(self.a(x)))


dist.init_process_group("gloo")
stuck_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
model = DDP(Net())
opt = torch.optim.SGD(model.parameters(), lr=0.01)

for step in range(stuck_at + 500):
    time.sleep(0.01)
    model(torch.randn(16, 32)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
