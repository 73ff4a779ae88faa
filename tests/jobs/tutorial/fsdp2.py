"""FSDP2 as PyTorch's examples write it (no pgdash in it): ``fully_shard`` per layer, then the
root, trained with gloo on CPU. FSDP2 issues its all-gathers and reduce-scatters from Python.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 4))
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)  # the root holds the last layer
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(args.steps):
        optimizer.zero_grad()
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
