"""Plain all_reduce training, 3 ranks under torchrun; a daemon thread on every rank all-reduces throughput metrics on a process group of its own (dist.new_group, made on the main thread before the thread starts) every half second, while the main thread trains on the default group. Nothing is wrong.
EXPECT kind=none ranks=3 launch=torchrun class=healthy
"""
import threading
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
metrics_group = dist.new_group(list(range(dist.get_world_size())))
done = threading.Event()
steps = [0]


def report_metrics():
    while not done.is_set():
        t = torch.tensor([float(steps[0])])
        dist.all_reduce(t, group=metrics_group)
        time.sleep(0.5)


thread = threading.Thread(target=report_metrics, daemon=True)
thread.start()
print(f"MARK {time.time():.6f}", flush=True)
w = torch.zeros(2048)
for step in range(500):
    grad = torch.randn(2048)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    steps[0] = step
    time.sleep(0.02)
done.set()
thread.join()
dist.destroy_process_group()
