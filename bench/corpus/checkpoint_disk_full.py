"""Plain DDP-style loop, 3 ranks; rank 0 saves a checkpoint every 40 steps and one save fails with OSError ENOSPC (disk full), which kills rank 0 while the others go on into the next all_reduce.
EXPECT kind=rank_failed culprit=0 ranks=3 launch=torchrun class=crash
"""
import errno
import io
import os
import random
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


class FullDisk(io.RawIOBase):
    """A file on a disk that fills up after a few KB, as /tmp or a full NFS quota does."""

    def __init__(self):
        self.written = 0

    def writable(self):
        return True

    def write(self, b):
        self.written += len(b)
        if self.written > 4096:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return len(b)


def save_checkpoint(state, step, full):
    target = FullDisk() if full else io.BytesIO()
    torch.save(state, target)


dist.init_process_group("gloo")
rank = dist.get_rank()
full_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(2, 5) * 40
w = torch.randn(4096)

for step in range(full_at + 400):
    grad = torch.randn(4096)
    dist.all_reduce(grad)
    w -= 1e-3 * grad
    if rank == 0 and step % 40 == 0 and step > 0:
        if step == full_at:
            fault("torch.save hits a full disk")
        save_checkpoint({"w": w, "step": step}, step, full=step == full_at)
    time.sleep(0.015)
dist.destroy_process_group()
