"""FSDP2-style training with torch.distributed.checkpoint, 3 ranks; every 40 steps dcp.save writes each rank's shard, and once rank 1's write fails (its node's scratch disk is full): DCP gathers the failure and raises it on every rank.
EXPECT kind=rank_failed culprit=1 ranks=3 launch=torchrun class=crash
"""
import errno
import os
import random
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


class ScratchWriter(FileSystemWriter):
    """Rank 1's node-local scratch disk fills up at the faulty save."""

    full = False

    def write_data(self, plan, planner):
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/scratch/ckpt/__1_0.distcp")
        return super().write_data(plan, planner)


dist.init_process_group("gloo")
rank = dist.get_rank()
full_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(2, 4) * 40
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
root = tempfile.mkdtemp(prefix="dcp-") if rank == 0 else None
holder = [root]
dist.broadcast_object_list(holder, src=0)
root = holder[0]

for step in range(full_at + 200):
    loss = model(torch.randn(8, 64)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    if step % 40 == 0 and step > 0:
        writer = ScratchWriter(os.path.join(root, f"step{step}"))
        if rank == 1 and step == full_at:
            fault("its shard's write hits a full disk inside dcp.save")
            writer.full = True
        dcp.save({"model": model.state_dict()}, storage_writer=writer)
    time.sleep(0.015)
dist.destroy_process_group()
