"""Plain all_reduce of gradients, 3 ranks under torchrun; at one step rank 2's gradient is smaller (a layer it skipped), and gloo aborts rank 2 inside that all_reduce.
EXPECT kind=desync|rank_lost culprit=2 ranks=3 launch=torchrun class=desync

gloo's C++ terminate (SIGABRT, "Received data size doesn't match expected size") kills rank 2
within milliseconds of entering the collective, before its agent reports anything: what can
be known is that rank 2 vanished there, while the others then fail with "Connection reset by
peer"; a size compared at the collective's entry would say desync.
"""
import os
import random
import time

import torch
import torch.distributed as dist

ODD = 2


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
odd_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.randn(1000)

for step in range(odd_at + 400):
    grad = torch.tanh(w) * 1e-3
    if rank == ODD and step == odd_at:
        fault("all-reduces a gradient of 600 elements where the others have 1,000")
        grad = grad[:600]  # the bias of a layer this rank skipped
    dist.all_reduce(grad)
    w[:grad.numel()] -= grad
    time.sleep(0.015)
dist.destroy_process_group()
