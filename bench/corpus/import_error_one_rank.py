"""torchrun, 3 ranks; rank 1's node lacks a package: its `import` of the model code fails with ModuleNotFoundError before init_process_group, while the others wait in the rendezvous.
EXPECT kind=rank_failed|init_incomplete culprit=1 ranks=3 launch=torchrun class=init
"""
import os
import time

import torch
import torch.distributed as dist

if os.environ["RANK"] == "1":
    print(f"FAULT {time.time():.6f} rank 1: imports a package its node lacks", flush=True)
    import flash_kernels_that_are_not_installed  # noqa: F401

dist.init_process_group("gloo")
t = torch.ones(8)
for step in range(200):
    dist.all_reduce(t)
    time.sleep(0.015)
dist.destroy_process_group()
