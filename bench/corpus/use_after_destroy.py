"""Plain all_reduce training under torchrun; rank 1 runs an end-of-epoch cleanup helper that calls destroy_process_group() by mistake, and its next all_reduce raises; the others wait for it.
EXPECT kind=rank_failed|rank_exited_early culprit=1 ranks=3 launch=torchrun class=crash
"""
import os
import random
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


def end_of_epoch_cleanup():
    # copied from the eval script, where it ran at exit
    dist.destroy_process_group()


dist.init_process_group("gloo")
rank = dist.get_rank()
epoch_len = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.zeros(1024)

for step in range(3 * epoch_len):
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
    if rank == 1 and step == epoch_len:
        fault("calls destroy_process_group() at the end of the epoch")
        end_of_epoch_cleanup()
dist.destroy_process_group()
