"""torchrun --max-restarts=1, 3 ranks; rank 1's node has a corrupt data shard, so it raises at the same step in attempt 0 and again in attempt 1, after which torchrun gives up.
EXPECT kind=rank_failed culprit=1 ranks=3 launch=torchrun class=elastic restarts=1
"""
import os
import random
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
# One store namespace per attempt (see elastic_restart.py).
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                      int(os.environ["WORLD_SIZE"]), is_master=False)
dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt-{attempt}", store),
                        rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
rank = dist.get_rank()
bad_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(40, 100)
w = torch.zeros(512)

for step in range(300):
    if rank == 1 and step == bad_step:
        if attempt == 0:
            fault("raises on a corrupt shard (in every attempt)")
        raise ValueError(f"corrupt record at offset {step * 4096} in shard-00001.tar")
    grad = torch.randn(512)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
