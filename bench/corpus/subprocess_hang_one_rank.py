"""Plain all_reduce training, 4 ranks under torchrun; every 50 steps each rank's checkpoint hook shells out (subprocess.run) to sync its shard to object storage; on rank 1 the upload command hangs (a stalled connection; no timeout= given), so rank 1 never comes back to all_reduce and the others wait.
EXPECT kind=hang culprit=1 ranks=4 launch=torchrun class=hang
"""
import os
import random
import subprocess
import sys
import time

import torch
import torch.distributed as dist

STUCK = 1


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")))
stuck_sync = rng.randint(2, 3)
t = torch.ones(1024)
for step in range(400):
    dist.all_reduce(t)
    t /= dist.get_world_size()
    time.sleep(0.015)
    if step % 50 == 49:
        hang = rank == STUCK and (step + 1) // 50 == stuck_sync
        if hang:
            fault("its shard upload (a child process) hangs")
        pause = "import time; time.sleep(3600 if %r else 0.05)" % hang
        subprocess.run([sys.executable, "-c", pause], check=True)
dist.destroy_process_group()
