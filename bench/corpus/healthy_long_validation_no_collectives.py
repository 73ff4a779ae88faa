"""Plain all_reduce training, 3 ranks under torchrun; after a few hundred steps every rank runs its validation pass over its own shard for about 40 s with no collective at all: a DataLoader's two worker processes decode and augment the samples (the CPU work) while the main thread runs a small model on each batch and sums the metric locally; then the ranks all_reduce the metric once and training resumes. Every rank is busy, none is at fault.
EXPECT kind=none ranks=3 launch=torchrun class=healthy
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
eval_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(150, 300)
w = torch.randn(256, 256) * 0.01


def validate(seconds):
    total, end = torch.zeros(2), time.monotonic() + seconds
    for batch in DataLoader(ValSet(), batch_size=16, num_workers=2):
        total += torch.tensor([float((batch @ w).pow(2).mean()), 1.0])
        if time.monotonic() > end:
            return total


for step in range(eval_step + 300):
    if step == eval_step:
        if rank == 0:
            print(f"MARK {time.time():.6f} rank 0: validation starts (about 40 s, no "
                  "collectives)", flush=True)
        metric = validate(38.0 + rank)
        dist.all_reduce(metric)
    grad = torch.randn(256, 256) * 0.001
    dist.all_reduce(grad)
    w -= grad
    time.sleep(0.015)
dist.destroy_process_group()
