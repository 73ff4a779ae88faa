"""Plain all_reduce training, 3 ranks under torchrun; a daemon thread on every rank all-reduces throughput metrics on a process group of its own every half second. On rank 1 that thread raises once (a metrics exporter's connection error) and ends, so ranks 0 and 2's metrics threads wait in that group's all_reduce forever, while every main thread goes on training.
EXPECT kind=hang culprit=1 ranks=3 launch=torchrun class=hang
"""
import os
import random
import threading
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
metrics_group = dist.new_group(list(range(dist.get_world_size())))
bad_report = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(6, 20)
steps = [0]


def report_metrics():
    for i in range(10**6):
        if rank == 1 and i == bad_report:
            fault("metrics thread raises and ends")
            raise ConnectionError("metrics exporter: connection refused")
        t = torch.tensor([float(steps[0])])
        dist.all_reduce(t, group=metrics_group)
        time.sleep(0.5)


threading.Thread(target=report_metrics, daemon=True).start()
w = torch.zeros(2048)
for step in range(3000):
    grad = torch.randn(2048)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    steps[0] = step
    time.sleep(0.02)
dist.destroy_process_group()
