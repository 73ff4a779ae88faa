"""3 ranks under torchrun; phase 1 trains with a pair group made by every rank, then destroys the process groups; phase 2 makes its world again (on its own store prefix) and new groups, numbered afresh by torch, and trains on. Nothing is wrong.
EXPECT kind=none ranks=3 launch=torchrun class=healthy
"""
import os
import time

import torch
import torch.distributed as dist

store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                      int(os.environ["WORLD_SIZE"]), is_master=False)
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
print(f"MARK {time.time():.6f}", flush=True)
for phase, pair in enumerate(([0, 1], [1, 2])):
    dist.init_process_group("gloo", store=dist.PrefixStore(f"phase-{phase}", store),
                            rank=rank, world_size=world)
    extra = dist.new_group([0, 2])  # every rank makes every group
    group = dist.new_group(pair)
    g = torch.zeros(1024)
    for step in range(150):
        g.normal_()
        dist.all_reduce(g)
        if rank in pair and step % 5 == 4:
            dist.all_reduce(g, group=group)
        time.sleep(0.015)
    dist.destroy_process_group()
