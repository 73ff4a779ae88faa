"""Two-stage pipeline, 2 ranks, blocking send/recv; after a refactor both stages send their tensor first and then receive (stage 0 its activations, stage 1 a gradient from the step before), once the tensors are too big for the transport's buffers both block in send forever.
EXPECT kind=hang culprit=0,1 ranks=2 launch=torchrun class=p2p
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
peer = 1 - rank
refactor_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
x = torch.randn(1 << 20)
y = torch.empty_like(x)

for step in range(refactor_step + 400):
    if step == refactor_step and rank == 0:
        fault("sends before it receives, as its peer does")
    if step < refactor_step and rank == 1:
        dist.recv(y, src=peer)
        dist.send(x, dst=peer)
    else:
        dist.send(x, dst=peer)
        dist.recv(y, src=peer)
    time.sleep(0.015)
dist.destroy_process_group()
