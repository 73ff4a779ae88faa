"""Hand-written 3-stage pipeline (blocking send/recv, stage i sends activations to i+1); after a refactor, stage 2 receives from src=0 once (a copy-pasted line in its "re-sync" path), so stage 1's send and stage 2's recv never meet.
EXPECT kind=hang culprit=2 ranks=3 launch=torchrun class=p2p
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
resync = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(40, 100)
act = torch.zeros(2048)
for step in range(resync + 300):
    if rank == 0:
        act = torch.randn(2048)
        time.sleep(0.01)  # forward of stage 0
        dist.send(act, dst=1)
    elif rank == 1:
        dist.recv(act, src=0)
        act = act * 0.5
        time.sleep(0.01)
        dist.send(act, dst=2)
    else:
        src = 1
        if step == resync:
            fault("receives from src=0 where stage 1 sends to it")
            src = 0  # the re-sync path's copy-pasted line
        dist.recv(act, src=src)
        time.sleep(0.01)
    if step % 20 == 19:
        dist.barrier()
dist.destroy_process_group()
