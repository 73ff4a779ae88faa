"""A hand-written 3-stage pipeline (send/recv) started by hand; the last stage reads a smaller max_steps from its own config and returns from training early (exit 0), so stage 1 waits forever to send it activations.
EXPECT kind=rank_exited_early culprit=2 ranks=3 launch=agent class=exit
"""
import os
import random
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
steps = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
mine = steps if rank == world - 1 else steps + 400
lin = torch.nn.Linear(64, 64)
for step in range(steps + 400):
    if step == mine:
        fault("the last stage thinks training is done and returns")
        break
    if rank == 0:
        x = torch.randn(8, 64)
    else:
        x = torch.empty(8, 64)
        dist.recv(x, src=rank - 1)
    with torch.no_grad():
        y = torch.relu(lin(x))
    if rank < world - 1:
        dist.send(y, dst=rank + 1)
    time.sleep(0.015)
if step != mine:
    dist.destroy_process_group()
