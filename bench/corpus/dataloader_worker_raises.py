"""Plain DDP-style training under torchrun with a DataLoader of 2 workers per rank; on rank 1 a worker's __getitem__ raises on a corrupt sample, and the DataLoader re-raises it in rank 1's training loop.
EXPECT kind=rank_failed culprit=1 ranks=3 launch=torchrun class=crash
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class Shards(Dataset):
    def __init__(self, rank, bad_index):
        self.rank, self.bad_index = rank, bad_index

    def __len__(self):
        return 10**6

    def __getitem__(self, i):
        if self.rank == 1 and i == self.bad_index:
            print(f"FAULT {time.time():.6f} rank 1: a worker reads a corrupt sample", flush=True)
            raise ValueError(f"corrupt sample {i}: cannot decode JPEG header")
        return torch.randn(64)


dist.init_process_group("gloo")
rank = dist.get_rank()
bad_index = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160) * 8
loader = DataLoader(Shards(rank, bad_index), batch_size=8, num_workers=2)
w = torch.zeros(64)
for step, batch in enumerate(loader):
    if step > bad_index // 8 + 400:
        break
    grad = batch.mean(0)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
