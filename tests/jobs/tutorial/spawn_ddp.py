"""DDP started by torch.multiprocessing.spawn, as PyTorch's DDP tutorial writes it (no pgdash
in it): the parent spawns one process per rank; each sets MASTER_ADDR/MASTER_PORT and calls
init_process_group with its rank. argv: world size, master port, steps, optionally a rank
that raises after the first step, and ``attach``: each rank calls pgdash's ``attach()`` first
(the program is then run with plain python, not under ``python -m pgdash_agent``)."""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(rank, world_size, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = port
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def demo_basic(rank, world_size, port, steps, failing, attach):
    if attach:
        from pgdash_agent import attach

        attach()
    setup(rank, world_size, port)
    model = DDP(nn.Linear(10, 5))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(steps):
        if rank == failing and step == 1:
            raise RuntimeError(f"boom in spawned rank {rank}")
        optimizer.zero_grad()
        model(torch.randn(20, 10)).sum().backward()
        optimizer.step()
        loss = torch.ones(1)
        dist.all_reduce(loss)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size, port, steps = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    failing = int(sys.argv[4]) if len(sys.argv) > 4 else -1
    attach = sys.argv[5:] == ["attach"]
    mp.spawn(demo_basic, args=(world_size, port, steps, failing, attach), nprocs=world_size,
             join=True)
