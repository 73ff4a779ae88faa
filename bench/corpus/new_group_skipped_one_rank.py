"""Plain all_reduce training, 3 ranks under torchrun; at the evaluation step every rank makes an eval group with dist.new_group([0, 1]) (which every rank of the job must call) except rank 2, whose `if rank in eval_ranks:` guard skips it; rank 2 goes on to the next all_reduce while ranks 0 and 1 wait in new_group for it.
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
    time.sleep(0.015)
dist.destroy_process_group()
