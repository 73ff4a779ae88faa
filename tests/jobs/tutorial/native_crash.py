"""Training whose native extension crashes on rank 1 after a few steps (SIGSEGV: no Python
exception, nothing for the agent to report); torchrun then stops the others."""

import ctypes
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
w = torch.zeros(1024)
for step in range(1000):
    if rank == 1 and step == 300:
        ctypes.string_at(0)  # a NULL dereference in C
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.01)
dist.destroy_process_group()
