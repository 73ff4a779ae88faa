"""Training under torchrun, 3 ranks, with the SLURM requeue pattern: a SIGTERM handler that sets a flag; at the next step boundary each rank saves its shard of a checkpoint and exits with status 143 (128 + SIGTERM) so the scheduler requeues the job. The scheduler preempts the job (SIGTERM to every rank): nobody is at fault.
EXPECT kind=none ranks=3 launch=torchrun class=healthy stop_after=5 stop=sigterm
"""
import os
import signal
import sys
import tempfile
import time

import torch
import torch.distributed as dist

stopping = {"now": False}
signal.signal(signal.SIGTERM, lambda signum, frame: stopping.update(now=True))
dist.init_process_group("gloo")
rank = dist.get_rank()
w = torch.zeros(2048)
for step in range(100000):
    if rank == 0 and step == 150:
        print(f"MARK {time.time():.6f}", flush=True)
    if stopping["now"]:
        path = os.path.join(tempfile.gettempdir(), f"requeue-{os.getpid()}-rank{rank}.pt")
        torch.save({"w": w, "step": step}, path)
        os.unlink(path)
        print(f"rank {rank}: preempted at step {step}; exiting 143 to be requeued", flush=True)
        sys.exit(143)
    grad = torch.randn(2048)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
