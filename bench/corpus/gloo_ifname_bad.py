"""3 ranks started by hand; rank 2's node exports GLOO_SOCKET_IFNAME=ib0 (an interface this host does not have), so its init_process_group fails while the others wait for it.
EXPECT kind=init_failed culprit=2 ranks=3 launch=agent class=init
"""
import os
import time

import torch
import torch.distributed as dist

if os.environ["RANK"] == "2":
    print(f"FAULT {time.time():.6f} rank 2: GLOO_SOCKET_IFNAME=ib0 on a host without it", flush=True)
    os.environ["GLOO_SOCKET_IFNAME"] = "ib0"
dist.init_process_group("gloo")
t = torch.ones(8)
for step in range(200):
    dist.all_reduce(t)
    time.sleep(0.015)
dist.destroy_process_group()
