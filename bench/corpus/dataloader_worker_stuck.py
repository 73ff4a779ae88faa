"""Plain all_reduce training with a DataLoader of 2 workers per rank, 3 ranks; a worker of rank 1 blocks forever reading a sample (a hung NFS read), so rank 1's DataLoader waits (timeout=0, the default) and never reaches the next all_reduce.
EXPECT kind=hang culprit=1 ranks=3 launch=torchrun class=hang
"""
import os
import random
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

STUCK_RANK = 1


class Samples(Dataset):
    def __init__(self, rank, stuck_at):
        self.rank, self.stuck_at = rank, stuck_at

    def __len__(self):
        return 100_000

    def __getitem__(self, i):  # in a worker process
        if self.rank == STUCK_RANK and i == self.stuck_at:
            print(f"FAULT {time.time():.6f} rank {self.rank}: a DataLoader worker blocks "
                  "forever reading a sample", flush=True)
            while True:
                time.sleep(1)
        return torch.randn(64)


dist.init_process_group("gloo")
rank = dist.get_rank()
stuck_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160) * 8
loader = DataLoader(Samples(rank, stuck_at), batch_size=8, num_workers=2)
w = torch.randn(64, 8)

for step, x in enumerate(loader):
    if step >= 600:
        break
    grad = x.t() @ torch.tanh(x @ w)
    dist.all_reduce(grad)
    w -= 1e-3 * grad
    time.sleep(0.015)
dist.destroy_process_group()
