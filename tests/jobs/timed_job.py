"""A gloo job that times each training step with the agent attached; prints RESULT as JSON.

argv[1]: steps. With argv[2] == "down-then-up" the server is expected to be down at first:
the job says DROPPING once its agent has had to drop events, and trains on until the agent is
connected again (at most 180 s), then 50 steps more, so the drops reach the server.
"""

import json
import resource
import sys
import time

import torch
import torch.distributed as dist

import pgdash_agent as agent

steps = int(sys.argv[1])
mode = sys.argv[2] if len(sys.argv) > 2 else ""
handle = agent.attach()
dist.init_process_group("gloo")
torch.manual_seed(dist.get_rank())
if mode == "down-then-up":
    # Offline, the agent merges its summaries and skips heartbeats (they cannot go stale in
    # its buffer), so only events that must each be kept can overflow it: new groups are such.
    groups = [dist.new_group([0, 1]) for _ in range(30)]
w = torch.randn(128, 128)
x = torch.randn(32, 128)
times = []
max_buffered = 0
said_dropping = False


def step():
    global max_buffered, said_dropping
    t0 = time.perf_counter()
    y = torch.tanh(x @ w) @ w.T
    dist.all_reduce(y)
    times.append(time.perf_counter() - t0)
    time.sleep(0.002)  # the rest of a step (data loading, ...), off the clock
    if handle is not None and len(times) % 10 == 0:
        stats = handle.stats()
        max_buffered = max(max_buffered, stats["buffered"])
        if mode and not said_dropping and sum(stats["dropped"].values()):
            # (a new group is seen by the agent's background thread, not at once)
            print("DROPPING", flush=True)
            said_dropping = True


for _ in range(steps):
    step()
if mode == "down-then-up":
    # Ranks agree on how many more steps to take: the one whose agent reconnects last decides.
    deadline = time.monotonic() + 180
    while True:
        done = torch.tensor([1.0 if handle.stats()["connected"] else 0.0])
        dist.all_reduce(done, op=dist.ReduceOp.MIN)
        if done.item() == 1.0 or time.monotonic() > deadline:
            break
        for _ in range(10):
            step()
    for _ in range(50):
        step()
    time.sleep(0.5)  # one more heartbeat carries the drop counts
stats = handle.stats() if handle is not None else {}
dist.barrier()
dist.destroy_process_group()
flushed = agent.detach()
print("RESULT", json.dumps({"times": times, "max_buffered": max_buffered,
                            "dropped": stats.get("dropped", {}), "flushed": flushed,
                            "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}),
      flush=True)
