"""Two 2-stage pipelines side by side, 4 ranks under torchrun: pipeline A is ranks 0 and 1, pipeline B ranks 2 and 3, each with its own group. Training sends activations to the next stage by its global rank; every so many steps an evaluation pass, written apart, sends with dst=1 (the next stage's index in its pipeline), which torch reads as a global rank. Pipeline A's evaluation works by accident; in pipeline B rank 2's send names global rank 1, which is not in its group: rank 2 raises, and rank 3 waits in its recv.
EXPECT kind=rank_failed|hang culprit=2 ranks=4 launch=torchrun class=crash
"""
import os
import random
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
pipes = [dist.new_group([0, 1]), dist.new_group([2, 3])]
pipe = pipes[rank // 2]
stage = rank % 2
first = rank - stage  # the global rank of this pipeline's first stage
eval_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)


def train_step():
    if stage == 0:
        dist.send(torch.randn(64, 128), dst=first + 1, group=pipe)
    else:
        dist.recv(torch.empty(64, 128), src=first, group=pipe)


def eval_step():
    if stage == 0:
        if rank == 2:
            print(f"FAULT {time.time():.6f} rank 2: evaluation sends to dst=1, its next stage's index in the pipeline, not its global rank (3)", flush=True)
        dist.send(torch.randn(64, 128), dst=1, group=pipe)  # meant: the next stage
    else:
        dist.recv(torch.empty(64, 128), src=first, group=pipe)


for step in range(eval_at + 300):
    train_step()
    if step == eval_at:
        eval_step()
    time.sleep(0.02)
dist.destroy_process_group()
