"""A gloo job that runs N all_reduces with a short sleep between them (argv[1], argv[2])."""

import sys
import time

import torch
import torch.distributed as dist

from pgdash_agent import attach

steps, pause = int(sys.argv[1]), float(sys.argv[2])
dist.init_process_group("gloo")
attach()  # after init: starts from the existing default group
t = torch.ones(8)
for step in range(steps):
    dist.all_reduce(t)
    time.sleep(pause)
dist.barrier()
dist.destroy_process_group()
