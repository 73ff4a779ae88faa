"""Plain DDP training, 3 ranks under torchrun, written as many scripts are: no dist.barrier() and no destroy_process_group() at the end; ranks 1 and 2 return from the script as soon as their last step is done, while rank 0 then saves the final model and writes its metrics for 6-9 s before it returns. Nothing is wrong.
EXPECT kind=none ranks=3 launch=torchrun class=healthy
"""
import os
import random
import tempfile
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")))
steps, save_s = rng.randint(300, 500), rng.uniform(6.0, 9.0)
model = DDP(torch.nn.Linear(64, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(steps):
    loss = model(torch.randn(16, 64)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.01)
if rank == 0:
    print(f"MARK {time.time():.6f} rank 0: saves the final model ({save_s:.0f} s); the others "
          "return", flush=True)
    end = time.monotonic() + save_s
    with tempfile.TemporaryDirectory() as d:
        while time.monotonic() < end:
            torch.save(model.module.state_dict(), os.path.join(d, "final.pt"))
            time.sleep(0.05)
