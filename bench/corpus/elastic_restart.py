"""torchrun --max-restarts=1, 3 ranks; in attempt 0 rank 1 crashes early on purpose (RuntimeError), attempt 1 runs clean to the end.
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
# torch 2.13: torchrun's workers reuse the launcher's store across restarts without a prefix,
# so a plain init_process_group("gloo") of attempt 1 can read attempt 0's stale gloo addresses
# ("Gloo connectFullMesh failed ... Connection refused"). One store namespace per attempt:
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                      int(os.environ["WORLD_SIZE"]), is_master=False)
dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt-{attempt}", store),
                        rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
rank = dist.get_rank()
crash_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(40, 100)
w = torch.zeros(512)

for step in range(300):
    if attempt == 0 and rank == 1 and step == crash_step:
        fault("attempt 0: raises RuntimeError (torchrun restarts the job)")
        raise RuntimeError("transient failure: lost connection to the feature store")
    grad = torch.randn(512)
    dist.all_reduce(grad)
    w -= 0.001 * grad
    time.sleep(0.02)
if rank == 0:
    print(f"attempt {attempt} finished", flush=True)
dist.destroy_process_group()
