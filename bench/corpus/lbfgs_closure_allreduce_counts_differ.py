"""Training under torchrun, 3 ranks, with torch.optim.LBFGS; the closure all-reduces the loss so that every rank optimises the global loss -- but LBFGS calls the closure as many times as its line search needs, which depends on the rank's own gradients (they are not all-reduced). Rank 1's shard is easier: once, its line search stops after fewer evaluations, so it calls 3 all-reduces fewer in that step. Every call being the same all-reduce of one float, the ranks' calls pair up out of step (the losses logged are wrong) and nothing shows until the end: rank 1 finishes its loop 3 calls early and leaves while the others wait in their last all-reduces.
EXPECT kind=desync|hang|rank_exited_early|rank_failed culprit=1 ranks=3 launch=torchrun class=uneven
"""
import os
import random
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
odd_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(30, 80)
torch.manual_seed(0)
w = torch.zeros(64, requires_grad=True)
x = torch.randn(256, 64)
y = x @ torch.randn(64)
opt = torch.optim.LBFGS([w], lr=0.05, max_iter=4, history_size=5)
for step in range(odd_step + 100):
    calls = {"n": 0}

    def closure():
        opt.zero_grad()
        loss = ((x @ w - y) ** 2).mean()
        loss.backward()
        calls["n"] += 1
        # the global loss, for logging and the schedule
        total = loss.detach().clone()
        dist.all_reduce(total)
        return loss

    if rank == 1 and step == odd_step:
        fault("rank 1's line search converges early: it evaluates the closure once, the others 4 times")
        opt_one = torch.optim.LBFGS([w], lr=0.05, max_iter=1, history_size=5)
        opt_one.step(closure)
    else:
        opt.step(closure)
    time.sleep(0.01)
dist.destroy_process_group()
