"""Ranks started by hand; rank 2 is killed by the OOM killer (SIGKILL) while it loads its data set, before it reaches init_process_group, so ranks 0 and 1 wait in the rendezvous.
EXPECT kind=rank_lost|init_incomplete culprit=2 ranks=3 launch=agent class=init
"""
import os
import signal
import time

import torch
import torch.distributed as dist

if os.environ.get("RANK") == "2":
    time.sleep(1.0)  # loading the data set
    print(f"FAULT {time.time():.6f} rank 2: SIGKILL by the OOM killer before init", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

dist.init_process_group("gloo")
w = torch.zeros(1024)
for step in range(300):
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
