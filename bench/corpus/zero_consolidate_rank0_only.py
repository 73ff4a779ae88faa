"""DDP with ZeroRedundancyOptimizer under torchrun, 3 ranks; every 50 steps the script saves the optimizer state, calling `consolidate_state_dict(to=0)` inside `if rank == 0:` -- but consolidation is collective: every rank must call it. Rank 0 waits in it while ranks 1 and 2 go on to the next step's gradient all-reduce.
EXPECT kind=desync|hang culprit=0 ranks=3 launch=torchrun class=desync
"""
import os
import random
import tempfile
import time

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
save_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(2, 4) * 50 - 1
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
where = os.path.join(tempfile.mkdtemp(prefix="corpus-zero-"), "optim.pt")
for step in range(save_at + 300):
    loss = model(torch.randn(16, 64)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.01)
    if step == save_at and rank == 0:
        fault("rank 0 alone consolidates the ZeRO optimizer state to save it")
        opt.consolidate_state_dict(to=0)
        torch.save(opt.state_dict(), where)
dist.destroy_process_group()
