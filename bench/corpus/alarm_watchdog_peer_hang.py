"""Plain all_reduce training, 3 ranks under torchrun, with a step watchdog of the user's own: signal.alarm(8) before each step, a SIGALRM handler that raises TimeoutError("step took longer than 8 s"); rank 0 stops arriving (it waits on a lock its logging thread never releases), and after 8 s every rank's watchdog raises TimeoutError: rank 0's in lock.acquire, ranks 1 and 2's inside all_reduce; all three die within a few milliseconds.
EXPECT kind=hang|rank_failed|rank_lost culprit=0 ranks=3 launch=torchrun class=hang
"""
import os
import random
import signal
import threading
import time

import torch
import torch.distributed as dist

STUCK = 0


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


def on_alarm(signum, frame):
    raise TimeoutError("step took longer than 8 s")


signal.signal(signal.SIGALRM, on_alarm)
dist.init_process_group("gloo")
rank = dist.get_rank()
stuck_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
log_lock = threading.Lock()
t = torch.ones(4096)
for step in range(stuck_at + 400):
    signal.alarm(8)
    if rank == STUCK and step == stuck_at:
        fault("waits on a lock its logging thread took and never released")
        threading.Thread(target=log_lock.acquire, daemon=True).start()
        time.sleep(0.1)
        log_lock.acquire()
    dist.all_reduce(t)
    t /= dist.get_world_size()
    time.sleep(0.015)
signal.alarm(0)
dist.destroy_process_group()
