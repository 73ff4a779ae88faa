"""DDP-style training under torchrun, 3 ranks, each reading batches through a DataLoader with 2 forked workers; the user cancels the job (scancel: SIGTERM to every process of the step, the ranks and their loader workers alike), and every rank dies of it, some perhaps after their DataLoader saw a worker killed first: nobody is at fault.
EXPECT kind=none ranks=3 launch=torchrun class=healthy stop_after=6 stop=sigterm
"""
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    def __len__(self):
        return 10_000_000

    def __getitem__(self, i):
        time.sleep(0.002)  # decoding a sample
        return torch.full((64,), float(i % 97))


dist.init_process_group("gloo")
rank = dist.get_rank()
loader = DataLoader(Samples(), batch_size=8, num_workers=2, multiprocessing_context="fork")
w = torch.zeros(64)
for step, batch in enumerate(loader):
    if step == 60 and rank == 0:
        print(f"MARK {time.time():.6f}", flush=True)
    grad = batch.mean(0)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    if step > 200_000:
        break
dist.destroy_process_group()
