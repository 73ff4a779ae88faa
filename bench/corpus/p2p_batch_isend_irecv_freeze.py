"""1-D stencil on a ring of 4 ranks, halo exchange with batch_isend_irecv; rank 3 freezes in its local update.
EXPECT kind=hang culprit=3 ranks=4 launch=torchrun class=p2p
"""
import os
import random
import time

import torch
import torch.distributed as dist

HALO, FROZEN = 4, 3


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
left, right = (rank - 1) % world, (rank + 1) % world
freeze_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(80, 200)
u = torch.rand(256)

for step in range(freeze_step + 600):
    from_left, from_right = torch.empty(HALO), torch.empty(HALO)
    ops = [dist.P2POp(dist.isend, u[:HALO].clone(), left),
           dist.P2POp(dist.isend, u[-HALO:].clone(), right),
           dist.P2POp(dist.irecv, from_left, left),
           dist.P2POp(dist.irecv, from_right, right)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    if rank == FROZEN and step == freeze_step:
        fault("rank freezes in its local stencil update")
        while True:
            time.sleep(1)
    padded = torch.cat([from_left, u, from_right])
    u = 0.25 * padded[: -2 * HALO] + 0.5 * u + 0.25 * padded[2 * HALO:]
    time.sleep(0.01)
dist.destroy_process_group()
