"""The training job ``pgdash demo`` runs on each rank: DDP over data-parallel groups, a
tensor-parallel all-reduce per step on a 2-wide mesh dimension, and a world-wide loss
all-reduce every few steps. Run by ``dashboard.demo``, one process per rank."""

from __future__ import annotations

import argparse
import signal
import time

from agent import attach


def _stop(signum, frame):
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", default="healthy")
    parser.add_argument("--steps", type=int, default=0, help="0: until interrupted")
    parser.add_argument("--step-time", type=float, default=0.1)
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
    try:
        while args.steps == 0 or step < args.steps:
            step += 1
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
                dist.all_reduce(logged)
                if rank == 0:
                    print(f"step {step}: loss {logged.item() / world:.4f}", flush=True)
            time.sleep(args.step_time)
        dist.barrier()
    except KeyboardInterrupt:
        pass
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
