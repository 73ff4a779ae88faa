"""Training under torchrun, 3 ranks, with a 25 s process-group timeout (set short so that a hang fails fast); every 40 steps rank 0 alone saves a checkpoint while the others wait at a barrier. Once the shared filesystem stalls and rank 0's save takes 40 s: the others' barrier times out (gloo's "Timed out waiting") and they fail, though nothing is wrong with them. (Goal 30 s: a wait at a barrier for one rank's own work is a stall only after stall_barrier_after, 30 s, since saves and evaluations there are long; the group's timeout ends this one at 25 s.)
EXPECT kind=hang|rank_failed|stall culprit=0 ranks=3 launch=torchrun class=hang goal=30
"""
import datetime
import os
import random
import tempfile
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


def save(state, path, stall_s):
    with open(path, "wb") as f:
        torch.save(state, f)
        deadline = time.time() + stall_s
        while time.time() < deadline:  # the filesystem takes its time to flush
            time.sleep(0.2)
            f.flush()


dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=25))
rank = dist.get_rank()
slow_save = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(2, 4)
where = os.path.join(tempfile.mkdtemp(prefix="corpus-ckpt-"), "last.pt")
w = torch.zeros(2048)
for step in range(40 * (slow_save + 4)):
    grad = torch.randn(2048)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.01)
    if step % 40 == 39:
        if rank == 0:
            stalled = step // 40 == slow_save
            if stalled:
                fault("the filesystem stalls: this save takes 40 s, the barrier's timeout is 25 s")
            save({"w": w}, where, 40.0 if stalled else 0.0)
        dist.barrier()
dist.destroy_process_group()
