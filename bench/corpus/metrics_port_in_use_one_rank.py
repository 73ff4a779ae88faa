"""Plain all_reduce training, 3 ranks under torchrun on one host; at the first evaluation each rank starts a small metrics HTTP server on 20000 + its port slot, but rank 2 computes its slot as `rank % 2` (a copy-paste from a 2-GPU config), takes rank 0's port, and fails with OSError: [Errno 98] Address already in use while the others wait in all_reduce.
EXPECT kind=rank_failed culprit=2 ranks=3 launch=torchrun class=crash
"""
import http.server
import os
import random
import socket
import threading
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")))
eval_at = rng.randint(60, 160)
base = rng.randint(21000, 29000)
t = torch.ones(1024)
server = None
for step in range(eval_at + 300):
    dist.all_reduce(t)
    t /= dist.get_world_size()
    if step == eval_at:
        slot = rank % 2 if rank == 2 else rank
        if rank == 2:
            time.sleep(0.2)  # rank 0 binds first
            fault("binds the metrics port of slot rank % 2, which rank 0 holds")
        server = http.server.HTTPServer(("127.0.0.1", base + slot),
                                        http.server.BaseHTTPRequestHandler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    time.sleep(0.015)
dist.destroy_process_group()
