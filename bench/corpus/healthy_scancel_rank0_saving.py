"""Training under torchrun, 3 ranks; every 40 steps rank 0 alone writes a checkpoint (torch.save of a large state, a second or more on a busy disk) while the others wait at a barrier; the user cancels the job (scancel: SIGTERM to every rank) while rank 0 is writing and the others wait for it: nobody is at fault.
EXPECT kind=none ranks=3 launch=torchrun class=healthy stop_after=3 stop=sigterm
"""
import os
import tempfile
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
w = torch.zeros(512)
state = {f"layer{i}": torch.randn(512, 512) for i in range(24)}  # ~25 MB
where = os.path.join(tempfile.mkdtemp(prefix="corpus-ckpt-"), "last.pt")
marked = False
for step in range(100000):
    grad = torch.randn(512)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.01)
    if step % 40 == 39:
        if rank == 0:
            if step >= 119 and not marked:
                print(f"MARK {time.time():.6f}", flush=True)  # (the cancel comes mid-save)
                marked = True
            for _ in range(6):  # a slow disk: the save takes a while
                torch.save(state, where)
        dist.barrier()
dist.destroy_process_group()
