"""Plain all_reduce training under torchrun with a SIGTERM handler that saves a checkpoint and exits 0 (the usual preemption handling); after a while the scheduler preempts the job (SIGTERM to every rank): nobody is at fault.
EXPECT kind=none ranks=3 launch=torchrun class=healthy stop_after=5 stop=sigterm
"""
import os
import random
import signal
import sys
import tempfile
import time

import torch
import torch.distributed as dist

stopping = {"now": False}


def on_sigterm(signum, frame):
    stopping["now"] = True


signal.signal(signal.SIGTERM, on_sigterm)
dist.init_process_group("gloo")
rank = dist.get_rank()
mark_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(150, 300)
w = torch.zeros(1024)
for step in range(mark_step + 3000):
    if rank == 0 and step == mark_step:
        print(f"MARK {time.time():.6f} rank 0: the scheduler preempts the job 5 s from now",
              flush=True)
    if stopping["now"]:
        path = os.path.join(tempfile.gettempdir(), f"preempt-{os.getpid()}.pt")
        torch.save({"w": w, "step": step}, path)
        os.unlink(path)
        print(f"rank {rank}: preempted at step {step}, checkpoint saved", flush=True)
        sys.exit(0)
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
