"""Plain all_reduce training, 3 ranks under torchrun; after a few hundred steps rank 0 alone evaluates (70-80 s) with a DataLoader of two worker processes that decode and augment the samples (the CPU work; rank 0's main thread mostly waits for their batches), while ranks 1 and 2 wait for it at dist.barrier(); then training resumes. Nothing is wrong.
EXPECT kind=none ranks=3 launch=torchrun class=healthy tolerate=stall
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class ValSet(Dataset):
    def __len__(self):
        return 10**6

    def __getitem__(self, i):  # decoding and augmenting a sample: CPU work, in a worker
        x = torch.randn(96, 96)
        for _ in range(12):
            x = torch.tanh(x @ x.t() * 0.01)
        return x.flatten()[:256]


dist.init_process_group("gloo")
rank = dist.get_rank()
rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")))
eval_step, eval_s = rng.randint(150, 300), rng.uniform(70.0, 80.0)
w = torch.randn(256, 256) * 0.01
for step in range(eval_step + 200):
    if step == eval_step:
        if rank == 0:
            print(f"MARK {time.time():.6f} rank 0: evaluation starts ({eval_s:.0f} s, rank 0 "
                  "alone, two loader workers)", flush=True)
            end, total = time.monotonic() + eval_s, 0.0
            for batch in DataLoader(ValSet(), batch_size=16, num_workers=2):
                total += float((batch @ w).pow(2).mean())
                if time.monotonic() > end:
                    break
        dist.barrier()
    grad = torch.randn(256, 256) * 0.001
    dist.all_reduce(grad)
    w -= grad
    time.sleep(0.015)
dist.destroy_process_group()
