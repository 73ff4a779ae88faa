"""Plain all_reduce training under torchrun; from a random step on, rank 1 runs a metrics thread that parses JSON in pure Python and holds the GIL, so rank 1's steps get slower and the others wait for it every step.
EXPECT kind=straggler culprit=1 ranks=3 launch=torchrun class=straggler
"""
import json
import os
import random
import threading
import time

import torch
import torch.distributed as dist

SLOW, SLOW_STEPS = 1, 220
BLOB = json.dumps([{"step": i, "loss": i * 0.5, "tags": ["a", "b"]} for i in range(3000)])


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


def metrics_thread(stop):
    while not stop.is_set():
        json.loads(BLOB)  # pure Python work that holds the GIL


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
slow_from = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(80, 200)
stop = threading.Event()
w = torch.zeros(1024)

for step in range(slow_from + SLOW_STEPS):
    if rank == SLOW and step == slow_from:
        fault("starts a GIL-bound metrics thread")
        threading.Thread(target=metrics_thread, args=(stop,), daemon=True).start()
    x = torch.randn(64, 64)
    for _ in range(20):  # some Python-side work per step, as a training step has
        x = torch.tanh(x @ x.t() / 64)
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad / world
    time.sleep(0.01)
    if rank == SLOW and step >= slow_from:
        print(f"STEP {step - slow_from + 1} {time.time():.6f}", flush=True)
stop.set()
dist.destroy_process_group()
