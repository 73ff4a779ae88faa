"""Training under torchrun, 3 ranks, saving checkpoints with torch.distributed.checkpoint -- but written as a single-process save would be, inside `if rank == 0:`. dcp.save is collective (it plans the save across ranks): rank 0 waits in it while ranks 1 and 2 go on training.
EXPECT kind=desync|hang culprit=0 ranks=3 launch=torchrun class=desync
"""
import os
import random
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
save_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 140)
where = tempfile.mkdtemp(prefix="corpus-dcp-")
w = torch.zeros(4096)
for step in range(save_at + 400):
    grad = torch.randn(4096)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.01)
    if step == save_at and rank == 0:
        fault("rank 0 alone calls dcp.save, a collective")
        dcp.save({"w": w, "step": torch.tensor(step)}, checkpoint_id=where)
dist.destroy_process_group()
