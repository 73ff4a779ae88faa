"""The first script a new user tries, 2 ranks under torchrun: init_process_group, twenty all_reduces of a small tensor, destroy_process_group, done in about a second. Nothing is wrong.
EXPECT kind=none ranks=2 launch=torchrun class=healthy
"""
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    print(f"MARK {time.time():.6f} rank 0: twenty all_reduces", flush=True)
t = torch.ones(8)
for _ in range(20):
    dist.all_reduce(t)
print(f"rank {dist.get_rank()}: {t[0].item():.0f}", flush=True)
dist.destroy_process_group()
