"""Plain all_reduce training with a DataLoader of 2 workers per rank, 3 ranks; a worker of rank 1 is killed (SIGKILL, as the OOM killer does) and its DataLoader raises in rank 1.
EXPECT kind=rank_failed culprit=1 ranks=3 launch=agent class=crash
"""
import os
import random
import signal
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

VICTIM_RANK = 1


class Samples(Dataset):
    def __init__(self, rank, killed_at):
        self.rank, self.killed_at = rank, killed_at

    def __len__(self):
        return 100_000

    def __getitem__(self, i):  # in a worker process: it prints the FAULT line itself
        if self.rank == VICTIM_RANK and i == self.killed_at:
            print(f"FAULT {time.time():.6f} rank {self.rank}: a DataLoader worker is killed "
                  "(SIGKILL)", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.randn(64)


dist.init_process_group("gloo")
rank = dist.get_rank()
killed_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160) * 8
loader = DataLoader(Samples(rank, killed_at), batch_size=8, num_workers=2)
w = torch.randn(64, 8)

for step, x in enumerate(loader):
    if step >= 600:
        break
    grad = x.t() @ torch.tanh(x @ w)
    dist.all_reduce(grad)
    w -= 1e-3 * grad
    time.sleep(0.015)
dist.destroy_process_group()
