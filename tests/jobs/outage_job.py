"""A gloo job that trains through a server outage and records, over time, what its agent costs.

argv[1]: seconds to train after every rank's agent is connected again (then it exits).
argv[2]: at most this many seconds in all (a bound, should the server never come back).

The server is expected to be down at the start. The job makes 30 process groups at once (each a
``group`` event the agent must keep, so a small PGDASH_MAX_BUFFERED_EVENTS overflows and
events are dropped and counted), prints ``TRAINING``, then trains step by step, each step timed
(``t`` since TRAINING, seconds). Every 0.5 s it samples its own RSS, the agent's buffer, drop
count and link, and the CPU time the agent's threads have used. Ranks agree every 10 steps (an all_reduce, off the clock) on whether all are
connected and for how long. Prints ``RESULT`` as JSON.
"""

import array
import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

import pgdash_agent as agent

after_s = float(sys.argv[1])
bound_s = float(sys.argv[2])
handle = agent.attach()
dist.init_process_group("gloo")
torch.manual_seed(dist.get_rank())
groups = [dist.new_group([0, 1]) for _ in range(30)]
w = torch.randn(128, 128)
x = torch.randn(32, 128)


def rss_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


CLOCK_TICK = os.sysconf("SC_CLK_TCK")
agent_threads: dict[int, float] = {}  # native id -> its CPU seconds when last seen
agent_cpu_gone = 0.0  # CPU seconds of agent threads that have ended (a connection's reader)


def agent_cpu_s() -> float:
    """CPU seconds the agent's threads (pgdash-*) have used so far, ended ones included."""
    global agent_cpu_gone
    live = {}
    for thread in threading.enumerate():
        if thread.name.startswith("pgdash") and thread.native_id is not None:
            try:
                with open(f"/proc/self/task/{thread.native_id}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                live[thread.native_id] = (int(fields[11]) + int(fields[12])) / CLOCK_TICK
            except (OSError, IndexError, ValueError):
                pass
    agent_cpu_gone += sum(cpu for tid, cpu in agent_threads.items() if tid not in live)
    agent_threads.clear()
    agent_threads.update(live)
    return agent_cpu_gone + sum(live.values())


def outbox_dropped(stats) -> int:
    """Events dropped from the outbox (not collectives the tracker could not record)."""
    return sum(n for kind, n in stats["dropped"].items()
               if kind not in ("collectives", "flight_recorder"))


print("TRAINING", flush=True)
start = time.perf_counter()
started_wall = time.time()  # step times + this = wall clock, as a harness switching keeps it
# Step times in flat arrays (16 bytes a step), so that the job's own record does not grow its
# RSS much over minutes: RSS is what is measured here.
step_at, step_s = array.array("d"), array.array("d")
samples = []  # [t, rss_kb, buffered, dropped, connected, agent threads' CPU seconds]
next_sample = 0.0
all_connected_at = None
while True:
    t0 = time.perf_counter()
    y = torch.tanh(x @ w) @ w.T
    dist.all_reduce(y)
    t1 = time.perf_counter()
    step_at.append(t0 - start)
    step_s.append(t1 - t0)
    time.sleep(0.002)  # the rest of a step (data loading, ...), off the clock
    now = t1 - start
    if now >= next_sample:
        stats = handle.stats()
        samples.append([round(now, 3), rss_kb(), stats["buffered"], outbox_dropped(stats),
                        bool(stats["connected"]), round(agent_cpu_s(), 3)])
        next_sample = now + 0.5
    if len(step_s) % 10 == 0:
        flag = torch.tensor([1.0 if handle.stats()["connected"] else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if flag.item() == 1.0 and all_connected_at is None:
            all_connected_at = now
        stop = torch.tensor([1.0 if (all_connected_at is not None
                                     and now - all_connected_at >= after_s)
                             or now >= bound_s else 0.0])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item() == 1.0:
            break
time.sleep(0.5)  # one more heartbeat carries the drop counts
stats = handle.stats()
dist.barrier()
dist.destroy_process_group()
flushed = agent.detach()
print("RESULT", json.dumps({"step_at": step_at.tolist(), "step_s": step_s.tolist(), "samples": samples, "connected_at": all_connected_at,
                            "dropped": stats["dropped"], "outbox_dropped": outbox_dropped(stats),
                            "flushed": flushed, "started_wall": started_wall, "session": stats["session"]}), flush=True)
