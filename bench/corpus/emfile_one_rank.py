"""Plain all_reduce training, 3 ranks under torchrun; rank 1's metrics logger opens a new file every step and never closes it, and its node has a low open-file limit (ulimit -n 256), so after a couple of hundred steps rank 1 fails with OSError: [Errno 24] Too many open files while the others wait in all_reduce.
EXPECT kind=rank_failed culprit=1 ranks=3 launch=torchrun class=crash
"""
import os
import random
import resource
import tempfile
import time

import torch
import torch.distributed as dist

LEAKY = 1


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
limit = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(160, 260)
logdir = tempfile.mkdtemp(prefix=f"metrics{rank}-")
kept = []
if rank == LEAKY:
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
t = torch.ones(1024)
for step in range(600):
    dist.all_reduce(t)
    t /= dist.get_world_size()
    if rank == LEAKY:
        try:
            f = open(os.path.join(logdir, f"step{step}.json"), "w")
        except OSError:
            fault("runs out of file descriptors (a file opened every step, never closed)")
            raise
        f.write('{"loss": 0.5}')
        kept.append(f)  # never closed
    time.sleep(0.015)
dist.destroy_process_group()
