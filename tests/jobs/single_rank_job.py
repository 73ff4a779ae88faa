"""A one-rank gloo job for agent behaviour tests; prints the agent's stats as JSON at the end.

argv[1] is the number of all_reduces; with argv[2] == "user-error" it also makes a bad call
and checks that the user's own exception comes through unchanged.
"""

import json
import sys

import torch
import torch.distributed as dist

import pgdash_agent as agent

steps = int(sys.argv[1])
mode = sys.argv[2] if len(sys.argv) > 2 else ""
handle = agent.attach()
dist.init_process_group("gloo")
t = torch.ones(1)
for _ in range(steps):
    dist.all_reduce(t)
assert t.item() == 1.0
if mode == "user-error":
    for call in (dist.all_reduce.__wrapped__, dist.all_reduce):  # torch's own, then wrapped
        try:
            call("not a tensor")
        except Exception as exc:
            print("USER-ERROR", type(exc).__name__, exc, flush=True)
dist.destroy_process_group()
flushed = agent.detach()
print("STATS", json.dumps({"attached": handle is not None, "flushed": flushed,
                           **(handle.stats() if handle else {})}), flush=True)
