"""Plain all_reduce training, 3 ranks under torchrun; the user debugs one node's network and exports NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=INIT,NET on rank 1 only (logging settings; this job runs on gloo anyway). Nothing is wrong.
EXPECT kind=none ranks=3 launch=torchrun class=healthy
"""
import os
import time

import torch
import torch.distributed as dist

if os.environ.get("RANK") == "1":
    os.environ["NCCL_DEBUG"] = "INFO"
    os.environ["NCCL_DEBUG_SUBSYS"] = "INIT,NET"
dist.init_process_group("gloo")
print(f"MARK {time.time():.6f}", flush=True)
t = torch.ones(1024)
for step in range(400):
    dist.all_reduce(t)
    t /= dist.get_world_size()
    time.sleep(0.015)
dist.destroy_process_group()
