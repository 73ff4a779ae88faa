"""Plain all_reduce training, 3 ranks under torchrun; every 60 steps each rank writes its own shard of a checkpoint before the next step's all_reduce, and rank 2's shard (it holds the embedding table) takes 2.5 s longer to write than the others', so they wait for it at that one collective each time. Nothing is wrong.
EXPECT kind=none ranks=3 launch=torchrun class=healthy
"""
import os
import tempfile
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
out = tempfile.mkdtemp(prefix=f"shard{rank}-")
print(f"MARK {time.time():.6f}", flush=True)
w = torch.zeros(1024)
for step in range(300):
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    if step % 60 == 59:
        torch.save({"w": w, "step": step}, os.path.join(out, f"shard{rank}.pt"))
        time.sleep(3.0 if rank == 2 else 0.5)  # writing the shard
    time.sleep(0.015)
dist.destroy_process_group()
