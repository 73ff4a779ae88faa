"""Plain loop, 3 ranks under torchrun; the job resumes from a sharded checkpoint every rank saved itself, but rank 1's shard file was never written (a quota error on the last save went unnoticed), so rank 1 raises FileNotFoundError while loading and the others wait in the first all_reduce.
EXPECT kind=rank_failed culprit=1 ranks=3 launch=torchrun class=crash
"""
import os
import random
import tempfile
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
folder = os.path.join(tempfile.gettempdir(), f"corpus-ckpt-{os.environ.get('PGDASH_JOB', 'x')}")
os.makedirs(folder, exist_ok=True)
saved_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(100, 200)
w = torch.zeros(512)
for step in range(saved_at):  # the first run
    grad = torch.randn(512)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
if rank != 1:  # rank 1's save failed silently
    torch.save({"w": w, "step": saved_at}, os.path.join(folder, f"shard-{rank}.pt"))
dist.barrier()
# ... the job is resumed from the checkpoint ...
if rank == 1:
    fault("loads a shard that was never written")
state = torch.load(os.path.join(folder, f"shard-{rank}.pt"))
w = state["w"]
for step in range(state["step"], 600):
    grad = torch.randn(512)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
