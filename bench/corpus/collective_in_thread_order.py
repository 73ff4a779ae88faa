"""Plain all_reduce training, 3 ranks under torchrun, with asynchronous checkpointing: after a save, each rank's background saver thread calls dist.barrier() to agree the checkpoint is complete. On rank 0 the save takes longer, so its saver's barrier is issued after its main thread's next all_reduce, while ranks 1 and 2 issue the barrier first: the two collectives are called in a different order on rank 0.
EXPECT kind=desync|hang culprit=0 ranks=3 launch=torchrun class=desync
"""
import os
import random
import threading
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
save_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.zeros(1024)


def saver(state, slow):
    torch.save(state, os.devnull)
    if slow:
        time.sleep(0.5)  # rank 0 writes the optimizer state too
        fault("its saver thread's barrier comes after its main thread's next all_reduce")
    dist.barrier()  # "the checkpoint is complete everywhere"


for step in range(save_at + 400):
    if step == save_at:
        th = threading.Thread(target=saver, args=({"w": w.clone()}, rank == 0), daemon=True)
        th.start()
        if rank != 0:
            th.join()  # (the fast ranks' saver is done before the next step)
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
