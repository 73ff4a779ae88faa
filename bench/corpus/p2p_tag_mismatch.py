"""Hand-written 3-stage pipeline (blocking send/recv, stage i sends activations to i+1); at one step stage 1 takes its evaluation path, which sends its activations with tag=1 (a refactor gave eval traffic its own tag) while stage 2 receives them with the default tag 0, so that send and that recv never meet.
EXPECT kind=hang culprit=1 ranks=3 launch=torchrun class=p2p
"""
import os
import random
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
eval_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(40, 100)
act = torch.zeros(2048)
for step in range(eval_at + 300):
    if rank == 0:
        act = torch.randn(2048)
        time.sleep(0.01)  # forward of stage 0
        dist.send(act, dst=1)
    elif rank == 1:
        dist.recv(act, src=0)
        act = act * 0.5
        time.sleep(0.01)
        tag = 0
        if step == eval_at:
            fault("sends its activations with tag=1 (its eval path) where stage 2 receives tag 0")
            tag = 1
        dist.send(act, dst=2, tag=tag)
    else:
        dist.recv(act, src=1)
        time.sleep(0.01)
    if step % 20 == 19:
        dist.barrier()
dist.destroy_process_group()
