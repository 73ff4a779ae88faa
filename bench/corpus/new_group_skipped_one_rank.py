"""Plain all_reduce training, 3 ranks under torchrun; at the first evaluation ranks 0 and 1 make an eval group with dist.new_group([0, 1]), but rank 2's `if rank in eval_ranks:` guard skips the call, which every rank of the job must make; 20 steps later every rank makes a checkpoint group of all three, and rank 2's copy of it gets another group name than ranks 0 and 1 (torch numbers groups in the order a process makes them), so its rendezvous never meets theirs and all three wait in new_group.
EXPECT kind=desync|hang culprit=2 ranks=3 launch=torchrun class=desync
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
eval_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
eval_ranks = [0, 1]
t = torch.ones(1024)
for step in range(eval_at + 300):
    dist.all_reduce(t)
    t /= dist.get_world_size()
    if step == eval_at:
        if rank in eval_ranks:
            group = dist.new_group(eval_ranks)
            score = torch.ones(1)
            dist.all_reduce(score, group=group)
        elif rank == 2:
            fault("skips dist.new_group([0, 1]) (it is not in the eval group)")
    if step == eval_at + 20:
        ckpt = dist.new_group(list(range(dist.get_world_size())))
        dist.barrier(group=ckpt)
    time.sleep(0.015)
dist.destroy_process_group()
