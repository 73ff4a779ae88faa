"""Plain all_reduce training, 3 ranks under torchrun; after init every rank spends ~25 s of CPU before its first collective (building and compiling the model, tokenizing a cache), then trains normally. Nothing is wrong.
EXPECT kind=none ranks=3 launch=torchrun class=healthy
"""
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
print(f"MARK {time.time():.6f}", flush=True)
x = torch.randn(128, 128)
deadline = time.time() + 25
while time.time() < deadline:  # model build and compile
    x = torch.tanh(x @ x.T / 128)
w = torch.zeros(1024)
for step in range(300):
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
