"""A job as an `srun` script writes it (no pgdash in it): rank and world size from SLURM's
variables, handed to init_process_group; a few all-reduces."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo", rank=int(os.environ["SLURM_PROCID"]),
                        world_size=int(os.environ["SLURM_NTASKS"]))
t = torch.ones(4)
for _ in range(3):
    dist.all_reduce(t)
dist.destroy_process_group()
