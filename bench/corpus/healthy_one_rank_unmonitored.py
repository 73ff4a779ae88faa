"""A healthy training job started with torch.multiprocessing.spawn, attach() in each worker; rank 2's agent is pointed at a server address nothing listens on (a typo in that node's config), so only ranks 0 and 1 report: the job itself is fine.
EXPECT kind=none ranks=3 launch=script class=healthy
"""
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from agent import attach

WORLD = 3


def dead_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, nowhere):
    if rank == 2:
        attach(server=f"http://127.0.0.1:{nowhere}")
    else:
        attach()
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    w = torch.zeros(1024)
    for step in range(500):
        grad = torch.randn(1024)
        dist.all_reduce(grad)
        w -= 0.01 * grad
        time.sleep(0.015)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(dead_port(),), nprocs=WORLD)
