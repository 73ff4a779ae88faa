"""DDP as PyTorch's tutorial writes it (no pgdash in it): a small MLP trained with gloo.

Per step one DistributedDataParallel forward/backward (its gradient all-reduces run in C++)
and one all_reduce of the loss for logging; a barrier at the end.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(16, 32)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = ToyModel()
    ddp_model = DDP(model)
    loss_fn = nn.MSELoss()
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=args.lr)
    for _ in range(args.steps):
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(8, 16))
        loss = loss_fn(outputs, torch.randn(8, 4))
        loss.backward()
        optimizer.step()
        reported = loss.detach().clone()
        dist.all_reduce(reported)
    dist.barrier()
    if rank == 0:
        print(f"trained {args.steps} steps, lr {args.lr}, last loss {reported.item() / dist.get_world_size():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
