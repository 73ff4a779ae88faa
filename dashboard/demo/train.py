"""The training job ``pgdash demo`` runs on each rank: DDP over data-parallel groups, a
tensor-parallel all-reduce per step on a 2-wide mesh dimension, and a world-wide loss
all-reduce every few steps. Run by ``dashboard.demo.run``, one process per rank.

Scenarios (``dashboard.demo.run.SCENARIOS``) inject one fault at ``--fault-step``;
``init-timeout`` and ``config-mismatch`` are the launcher's (a rank never started, a
different setting).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import time

from pgdash_agent import attach




def _stop(signum, frame):
    # One clean stop: a second SIGTERM (it can come at once) must not interrupt the teardown
    # with a traceback.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def inject(scenario: str, rank: int, last: int) -> None:
    """Faults that happen at one moment, on the rank they concern."""
    if scenario == "hang" and rank == last:
        print(f"rank {rank}: injected hang", flush=True)
        while True:
            time.sleep(3600)
    if scenario == "frozen" and rank == last:
        print(f"rank {rank}: blocked in C with the GIL held", flush=True)
        # Backtracks for ever inside _sre, which never lets the GIL go: no other thread of
        # this process (the agent's included) runs again. SIGTERM still stops it.
        re.match(r"(a+)+$", "a" * 64 + "!")
    if scenario == "checkpoint" and rank == 0:  # healthy: a pause is not a fault
        print(f"rank {rank}: checkpointing for 5 s", flush=True)
        time.sleep(5.0)
    if scenario == "crash" and rank == 1:
        raise RuntimeError("demo: injected failure on rank 1")
    if scenario == "kill" and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", default="healthy")
    parser.add_argument("--steps", type=int, default=0, help="0: until interrupted")
    parser.add_argument("--step-time", type=float, default=0.1)
    parser.add_argument("--fault-step", type=int, default=50)
    args = parser.parse_args()

    signal.signal(signal.SIGTERM, _stop)  # the demo stops its ranks with SIGTERM
    attach()  # before init_process_group: the rendezvous is reported as it happens

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    dp_group = tp_group = None
    if world >= 4 and world % 2 == 0:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        dp_group, tp_group = mesh.get_group("dp"), mesh.get_group("tp")

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 8))
    ddp = DDP(model, process_group=dp_group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    step = 0
    last = world - 1
    faulty = False
    try:
        while args.steps == 0 or step < args.steps:
            step += 1
            if step == args.fault_step:
                faulty = True
                inject(args.scenario, rank, last)
            x = torch.randn(32, 64)
            loss = ddp(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if tp_group is not None:  # stands in for a row-parallel layer's partial sums
                activations = torch.randn(16, 128)
                dist.all_reduce(activations, group=tp_group)
            if step % 10 == 0:
                logged = loss.detach().clone()
                if faulty and args.scenario == "desync" and rank == last and step % 20 == 0:
                    dist.broadcast(logged, src=0)
                else:
                    dist.all_reduce(logged)
                if rank == 0:
                    print(f"step {step}: loss {logged.item() / world:.4f}", flush=True)
            slow = faulty and args.scenario == "straggler" and rank == last
            time.sleep(args.step_time * (1.3 if slow else 1.0))
        dist.barrier()
    except KeyboardInterrupt:
        pass
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
