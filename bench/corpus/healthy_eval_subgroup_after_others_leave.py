"""Plain all_reduce training, 4 ranks under torchrun; after training, only ranks 0 and 1 evaluate (the evaluation set is sharded over an `eval_group` of those two, made by every rank with new_group as torch requires), all-reducing their metrics on that group for 10-15 s, while ranks 2 and 3 call destroy_process_group and return at once. Nothing is wrong: nobody waits for ranks 2 and 3.
EXPECT kind=none ranks=4 launch=torchrun class=healthy
"""
import os
import random
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")))
steps, eval_s = rng.randint(200, 400), rng.uniform(10.0, 15.0)
eval_group = dist.new_group([0, 1])
w = torch.zeros(1024)
for step in range(steps):
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
if rank in (0, 1):
    if rank == 0:
        print(f"MARK {time.time():.6f} rank 0: ranks 0 and 1 evaluate on their own group; "
              "ranks 2 and 3 leave", flush=True)
    end = time.monotonic() + eval_s
    while time.monotonic() < end:
        metric = torch.randn(4)
        dist.all_reduce(metric, group=eval_group)
        time.sleep(0.02)
dist.destroy_process_group()
