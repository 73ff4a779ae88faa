"""Plain all_reduce training, 3 ranks under torchrun; after a few hundred steps rank 0 alone evaluates the model on the validation set (70-80 s of forward passes on the CPU, as a generation or FID evaluation takes) while the others wait for it at dist.barrier(), then training resumes. Nothing is wrong (the others' wait is what the code asks for; gloo's timeout is 30 minutes).
EXPECT kind=none ranks=3 launch=torchrun class=healthy tolerate=stall
"""
import os
import random
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")))
eval_step, eval_s = rng.randint(150, 300), rng.uniform(70.0, 80.0)
w = torch.randn(256, 256) * 0.01
for step in range(eval_step + 200):
    if step == eval_step:
        if rank == 0:
            print(f"MARK {time.time():.6f} rank 0: evaluation starts ({eval_s:.0f} s, rank 0 "
                  "alone)", flush=True)
            end = time.monotonic() + eval_s
            while time.monotonic() < end:
                x = torch.randn(64, 256)
                for _ in range(8):
                    x = torch.tanh(x @ w)
        dist.barrier()
    grad = torch.randn(256, 256) * 0.001
    dist.all_reduce(grad)
    w -= grad
    time.sleep(0.015)
dist.destroy_process_group()
