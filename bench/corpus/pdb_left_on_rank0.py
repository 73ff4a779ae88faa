"""Plain all_reduce training, 3 ranks under the agent, launched from a batch script (stdin is /dev/null); a `breakpoint()` left in rank 0's validation branch reads end-of-file at its prompt and pdb quits with BdbQuit, killing rank 0 while the others wait in all_reduce.
EXPECT kind=rank_failed culprit=0 ranks=3 launch=agent class=crash
"""
import os
import random
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
val_every = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.zeros(1024)
for step in range(val_every * 3):
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    if rank == 0 and step == val_every:
        fault("reaches a breakpoint() left in its validation branch, with stdin at end of file")
        loss = float(w.abs().mean())
        breakpoint()  # "look at loss here"
        print(f"val loss {loss:.4f}", flush=True)
    time.sleep(0.015)
dist.destroy_process_group()
