"""Plain all_reduce training, 3 ranks under torchrun; rank 1 starts a non-daemon metrics-uploader thread that waits on a queue nobody closes. Training ends on every rank and each destroys its process group, but rank 1's process never exits (the interpreter joins the thread forever), so torchrun never returns.
EXPECT kind=stall|hang culprit=1 ranks=3 launch=torchrun class=exit
"""
import os
import queue
import random
import threading
import time

import torch
import torch.distributed as dist


def fault(what, rank):
    print(f"FAULT {time.time():.6f} rank {rank}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
steps = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(150, 300)
metrics = queue.Queue()


def uploader():
    while True:
        item = metrics.get()  # no sentinel is ever put: this waits forever at the end
        if item is None:
            return


if rank == 1:
    threading.Thread(target=uploader, name="metrics-uploader").start()  # not daemon=True

w = torch.zeros(1024)
for step in range(steps):
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    if rank == 1:
        metrics.put(float(w[0]))
    time.sleep(0.015)
print(f"rank {rank}: training done", flush=True)
dist.destroy_process_group()
if rank == 1:
    fault("returns from main, but its non-daemon uploader thread keeps the process alive", rank)
