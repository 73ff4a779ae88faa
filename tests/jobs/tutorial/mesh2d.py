"""A 2-D DeviceMesh (data x tensor parallel) as PyTorch's tutorial builds it (no pgdash in
it): 4 ranks, ``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))``. Each step
all-reduces a tensor-parallel partial result over "tp" and the gradient over "dp".
"""

import argparse

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    tp_group, dp_group = mesh["tp"].get_group(), mesh["dp"].get_group()
    weight = torch.randn(8, 8)
    for _ in range(args.steps):
        partial = torch.randn(4, 8) @ weight
        dist.all_reduce(partial, group=tp_group)
        grad = partial.sum(0)
        dist.all_reduce(grad, group=dp_group)
        weight -= 1e-3 * grad
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
