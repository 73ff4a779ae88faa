"""Plain all_reduce training, 3 ranks; rank 0 saves a checkpoint twice (6-8 s, then 9-11 s on slower storage) while the others wait at a barrier.
EXPECT kind=none ranks=3 launch=agent class=healthy
"""
import os
import random
import tempfile
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")))
every = rng.randint(100, 160)
pauses = [rng.uniform(6, 8), rng.uniform(9, 11)]
w = torch.zeros(4096)

with tempfile.TemporaryDirectory() as tmp:
    for step in range(3 * every):
        grad = torch.randn(4096)
        dist.all_reduce(grad)
        w -= 0.001 * grad / world
        time.sleep(0.015)
        if step % every == every - 1 and step // every < len(pauses):
            if rank == 0:
                start = time.time()
                torch.save({"w": w, "step": step}, os.path.join(tmp, f"ckpt-{step}.pt"))
                time.sleep(max(0.0, pauses[step // every] - (time.time() - start)))  # slow disk
                print(f"checkpoint at step {step}: {time.time() - start:.1f} s", flush=True)
            dist.barrier()
dist.destroy_process_group()
