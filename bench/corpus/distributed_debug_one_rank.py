"""Plain all_reduce training, 3 ranks under torchrun; rank 1's node exports TORCH_DISTRIBUTED_DEBUG=DETAIL (left in its shell profile from an earlier debugging session), which wraps that rank's process groups in c10d's checking wrapper: its collectives no longer match the others'.
EXPECT kind=config_mismatch|desync|hang|init_incomplete culprit=1 ranks=3 launch=torchrun class=init
"""
import os
import time

import torch
import torch.distributed as dist

if os.environ.get("RANK") == "1":
    print(f"FAULT {time.time():.6f} rank 1: TORCH_DISTRIBUTED_DEBUG=DETAIL from its shell profile",
          flush=True)
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
dist.init_process_group("gloo")
t = torch.ones(1024)
for step in range(300):
    dist.all_reduce(t)
    t /= dist.get_world_size()
    time.sleep(0.015)
dist.destroy_process_group()
