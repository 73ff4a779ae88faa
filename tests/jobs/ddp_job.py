"""A DDP training job whose collectives come from three places, for the Flight Recorder tests.

Per step: DDP's gradient all-reduces (issued from C++ by the reducer, one per bucket), one
Python ``dist.all_reduce`` of the loss (every other step ``async_op=True``), and one functional
all-reduce (``torch.distributed._functional_collectives``, C++ as well). A Python all-reduce
on a second group shows that a group only Python uses gets no Flight Recorder rows.

Writes to ``--out`` (rank 0) what the test must find: the DDP buckets all-reduced (counted
from the reducer's own logging data, not guessed), the functional and Python calls.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.nn.parallel import DistributedDataParallel as DDP

from pgdash_agent import attach


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", default="")
    args = parser.parse_args()

    attach()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    side = dist.new_group([0, 1])
    # Small buckets: several all-reduces per backward, and a rebuild after the first step.
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 8))
    ddp = DDP(model, bucket_cap_mb=0.02)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for step in range(args.steps):
        loss = ddp(torch.randn(16, 64)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        logged = loss.detach().clone()
        if step % 2:
            dist.all_reduce(logged, async_op=True).wait()
        else:
            dist.all_reduce(logged)
        out = funcol.wait_tensor(funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD))
        assert out[0].item() == dist.get_world_size()
        dist.all_reduce(torch.ones(2), group=side)
    # DDP all-reduces each bucket once per backward: the first step on its initial buckets,
    # every later one on the buckets it rebuilt after the first (the reducer's own record).
    data = ddp._get_ddp_logging_data()
    first = len(str(data["bucket_sizes"]).split(","))
    rebuilt = len(str(data.get("rebuilt_bucket_sizes") or data["bucket_sizes"]).split(","))
    buckets = first + (args.steps - 1) * rebuilt
    if rank == 0 and args.out:
        with open(args.out + ".tmp", "w") as fh:
            json.dump({"ddp_buckets": buckets, "funcol": args.steps, "python": args.steps,
                       "side": args.steps, "bucket_sizes": str(data.get("bucket_sizes")),
                       "rebuilt": str(data.get("rebuilt_bucket_sizes"))}, fh)
        os.replace(args.out + ".tmp", args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
