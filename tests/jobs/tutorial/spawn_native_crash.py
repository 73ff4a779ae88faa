"""native_crash.py started by torch.multiprocessing.spawn (3 ranks): rank 1's native extension
crashes (SIGSEGV) after a few steps; the parent, which waits on every rank, reaps it at once
and terminates the others. argv: master port."""

import ctypes
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def train(rank, world_size, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = port
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    w = torch.zeros(1024)
    for step in range(1000):
        if rank == 1 and step == 300:
            ctypes.string_at(0)  # a NULL dereference in C
        grad = torch.randn(1024)
        dist.all_reduce(grad)
        w -= 0.01 * grad
        time.sleep(0.01)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(train, args=(3, sys.argv[1]), nprocs=3)
