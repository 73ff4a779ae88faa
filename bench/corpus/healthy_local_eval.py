"""Plain loop, 3 ranks under torchrun; after a while every rank evaluates its own validation shard for about 45 s without any collective (the model in eval mode, metrics kept locally), then all-reduces the metric once and trains on: nothing is wrong.
EXPECT kind=none ranks=3 launch=torchrun class=healthy
"""
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(1)
w = torch.randn(256, 256)
for step in range(150):
    grad = torch.randn(256, 256)
    dist.all_reduce(grad)
    w -= 0.001 * grad
    time.sleep(0.015)
print(f"MARK {time.time():.6f}", flush=True)
loss, end = torch.zeros(1), time.time() + 45
while time.time() < end:  # the validation pass: compute only
    x = torch.randn(64, 256)
    loss += (x @ w).pow(2).mean()
dist.all_reduce(loss)
for step in range(150):
    grad = torch.randn(256, 256)
    dist.all_reduce(grad)
    w -= 0.001 * grad
    time.sleep(0.015)
dist.destroy_process_group()
