"""A gloo job that runs a fixed plan of collectives; tests/test_pipeline.py knows the plan.

Counts per rank (world size W >= 2), default group "0":
  all_reduce 7 sync + 2 async; broadcast 3; all_gather 2 + 2 (all_gather_object runs two);
  all_gather_single 1 (via all_gather_into_tensor); barrier 1.
Subgroup [0, 1] (group "1"): all_reduce 5 on ranks 0 and 1.
Point-to-point on group "0": rank 0 send 2 + isend 1; rank 1 recv 2 + irecv 1.
"""

import torch
import torch.distributed as dist

from pgdash_agent import attach

attach()  # before init: the rendezvous is reported
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
sub = dist.new_group([0, 1])
t = torch.ones(4)

for _ in range(7):
    dist.all_reduce(t)
for _ in range(2):
    dist.all_reduce(t, async_op=True).wait()
for _ in range(3):
    dist.broadcast(t, src=0)
for _ in range(2):
    dist.all_gather([torch.zeros(4) for _ in range(world)], t)
objects = [None] * world
dist.all_gather_object(objects, {"rank": rank})
assert objects[1] == {"rank": 1}
dist.all_gather_into_tensor(torch.zeros(4 * world), t)
if rank in (0, 1):
    for _ in range(5):
        dist.all_reduce(t, group=sub)
if rank == 0:
    dist.send(t, dst=1)
    dist.send(t, dst=1)
    dist.isend(t, dst=1).wait()
elif rank == 1:
    dist.recv(t, src=0)
    dist.recv(t, src=0)
    dist.irecv(t, src=0).wait()
dist.barrier()
dist.destroy_process_group()
# No detach(): the agent flushes at interpreter exit, which is what users rely on.
