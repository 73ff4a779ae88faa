"""Plain all_reduce loop over text data, 3 ranks; rank 2 meets a sample on which its cleaning regex backtracks catastrophically: the match runs in C with the GIL held for minutes, so rank 2's every thread (its agent's too) stops while its process stays up.
EXPECT kind=hang|rank_lost culprit=2 ranks=3 launch=agent class=frozen stop_after=40 stop=sigterm
"""
import os
import random
import re
import time

import torch
import torch.distributed as dist

CLEAN = re.compile(r"^(\w+\s?)*$")


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
bad_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
t = torch.ones(1024)

for step in range(bad_step + 400):
    sample = "a clean sample of text"
    if rank == 2 and step == bad_step:
        fault("a regex backtracks catastrophically on its sample")
        sample = "x" * 60 + "!"
    CLEAN.match(sample)
    dist.all_reduce(t)
    t /= dist.get_world_size()
    time.sleep(0.015)
dist.destroy_process_group()
