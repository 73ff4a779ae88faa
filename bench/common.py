"""What the bench scripts share: percentiles and figures printed beside a same-run reference,
``pgdash serve`` processes on free ports stopped by their PID, and the synthetic job: what a
real agent sends at its defaults (hello, rendezvous, groups, then once a second a heartbeat, a
latency summary and a GPU reading), for any world size and device mesh.

Scripts run as ``python -m bench.NAME`` from the repository root, which puts the checkout on
``sys.path``: ``dashboard``, ``pgdash_agent`` and the tests' process helpers
(``tests.helpers``) import from there, with no path edits.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
import uuid
from pathlib import Path

from tests.helpers.procs import ServerProcess, free_port  # noqa: F401  (re-exported)
from pgdash_agent.config import AgentConfig

ROOT = Path(__file__).resolve().parent.parent


def checkout_env(root: Path) -> dict[str, str]:
    """The environment of a worker that runs one of this checkout's benches against the
    pgdash of ``root``: ``root`` first on PYTHONPATH, this checkout after it (for ``bench``),
    and not the script's own folder (PYTHONSAFEPATH)."""
    return dict(os.environ, PYTHONSAFEPATH="1",
                PYTHONPATH=os.pathsep.join([str(root), str(ROOT)]))


# -- figures --------------------------------------------------------------------------------

def pct(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``values``, nearest rank; None when there are none."""
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def fmt(v, spec: str = ".2f") -> str:
    """A figure for a table: ``-`` when there is none."""
    if v is None:
        return "-"
    if isinstance(v, float) and v == float("inf"):
        return "inf"
    return format(v, spec)


def against(value: float | None, reference: float | None, spec: str = ".2f",
            unit: str = "") -> str:
    """``value`` beside the same run's reference and their ratio: machines here are noisy, so
    a figure means something only next to one measured at the same time."""
    ratio = (f", x{value / reference:.2f}" if value is not None and reference
             else "")
    return f"{fmt(value, spec)}{unit} (reference {fmt(reference, spec)}{unit}{ratio})"


# -- servers --------------------------------------------------------------------------------

def rank_env(rank: int, world: int, port: int | str, **extra: str) -> dict[str, str]:
    """The environment torchrun gives rank ``rank`` of ``world`` on one host (loopback
    rendezvous on ``port``, one OpenMP thread), plus ``extra``."""
    return dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                OMP_NUM_THREADS="1", **extra)


def start_servers(k: int, db: str, extra: list[str], workdir: Path,
                  tag: str, root: Path = ROOT) -> list[ServerProcess]:
    """K ``pgdash serve`` processes on one store, each on a free port and answering before the
    next starts (each migrates the database on start; one after the other keeps the logs
    readable), run from the checkout ``root``. Stopped with :func:`stop_servers`."""
    servers: list[ServerProcess] = []
    try:
        for i in range(k):
            servers.append(ServerProcess(db, extra=extra, root=root,
                                         log_path=workdir / f"server-{tag}-p{i + 1}.log").start())
    except BaseException:
        stop_servers(servers)
        raise
    return servers


def stop_servers(servers: list[ServerProcess]) -> None:
    for srv in servers:
        srv.stop()


def stop_by_pid(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    """Stop processes this script started, by PID: SIGTERM, then SIGKILL after ``grace_s``."""
    for p in procs:
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


# -- the synthetic job ----------------------------------------------------------------------

Group = tuple[str, str, list[int]]  # (name, init_device_mesh description, ranks)

OPS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "barrier",
       "send", "recv", "all_to_all_single", "gather")
OPS_PER_SECOND = 9  # coll_stats rows a rank sends each second (one per operation it ran)


def default_mesh(world: int) -> tuple[int, int, int]:
    """(dp, pp, tp) of a typical job this size: tp=8 within a host, pp=8 from 256 ranks."""
    tp = 8 if world % 8 == 0 else 1
    pp = 8 if world % (tp * 8) == 0 and world >= 256 else 1
    return world // (tp * pp), pp, tp


def mesh_groups(world: int, dims: tuple[int, int, int] | None = None) -> list[Group]:
    """The world group and the dp/pp/tp groups of a row-major (dp, pp, tp) mesh (tp innermost,
    so a tensor-parallel group is one host), as ``init_device_mesh`` reports them."""
    dp, pp, tp = dims or default_mesh(world)
    if dp * pp * tp != world:
        raise SystemExit(f"a {dp}x{pp}x{tp} mesh has {dp * pp * tp} ranks, not {world}")

    def rank(d: int, p: int, t: int) -> int:
        return (d * pp + p) * tp + t

    groups: list[Group] = [("0", "default_pg", list(range(world)))]
    families = {
        "mesh_dp": [[rank(d, p, t) for d in range(dp)] for p in range(pp) for t in range(tp)],
        "mesh_pp": [[rank(d, p, t) for p in range(pp)] for d in range(dp) for t in range(tp)],
        "mesh_tp": [[rank(d, p, t) for t in range(tp)] for d in range(dp) for p in range(pp)],
    }
    for desc, members in families.items():
        for ranks in members:
            groups.append((str(len(groups)), desc, sorted(ranks)))
    return groups


def members(groups: list[Group], world: int) -> dict[int, list[Group]]:
    """Per rank: the groups it belongs to."""
    out: dict[int, list[Group]] = {r: [] for r in range(world)}
    for g in groups:
        for r in g[2]:
            out[r].append(g)
    return out


def host_of(rank: int, per_host: int = 8) -> str:
    return f"node{rank // per_host:04d}"


def start_events(rank: int, world: int, job: str, groups: list[Group],
                 host: str | None = None, now: float | None = None,
                 init_start_at: float | None = None) -> list[tuple[str, dict, float]]:
    """What an agent sends as its rank starts: hello, the rendezvous and its groups, as
    ``(kind, body, t)``. ``init_start_at`` sets when the rank entered the rendezvous
    (launchers start hosts a little apart; it ends for all at once)."""
    host = host or host_of(rank)
    now = time.time() if now is None else now
    env = {"MASTER_ADDR": "node0000", "MASTER_PORT": "29500", "WORLD_SIZE": str(world),
           "RANK": str(rank), "LOCAL_RANK": str(rank % 8), "NCCL_DEBUG": "WARN",
           "NCCL_SOCKET_IFNAME": "ib0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
    events = [("hello", {"job": job, "rank": rank, "world_size": world, "local_rank": rank % 8,
                         "host": host, "pid": 10_000 + rank, "backend": "nccl",
                         "device": f"cuda:{rank % 8}", "gpu_uuid": f"GPU-{uuid.uuid4()}",
                         "versions": {"torch": "2.13.0", "cuda": "13.0", "nccl": "2.27.5",
                                      "python": "3.11.7"}, "env": env}, now),
              ("init_start", {"init_method": "env://", "backend": "nccl", "rank": rank,
                              "world_size": world, "master_addr": "node0000",
                              "master_port": "29500", "timeout_s": 600.0},
               now if init_start_at is None else init_start_at),
              ("init_done", {"rank": rank, "world_size": world, "backend": "nccl",
                             "duration_s": 1.0}, now)]
    for name, desc, ranks in groups:
        events.append(("group", {"name": name, "desc": desc, "backend": "nccl",
                                 "ranks": ranks}, now))
    return events


def agent_schedule(config: AgentConfig | None = None) -> list[tuple[float, bool]]:
    """When the agent sends, over one heartbeat period at ``config``'s settings (its defaults
    unless given; ``pgdash_agent.loop.AgentLoop._loop``): ``(offset s, heartbeat?)``. At the
    heartbeat it sends a latency summary, the heartbeat and a GPU reading; between two
    heartbeats, a latency summary every ``stats_interval_s`` (not one just before the next
    heartbeat's). At the defaults: [(0.0, True), (0.5, False)]."""
    cfg = config or AgentConfig()
    out, k = [(0.0, True)], 1
    while cfg.interval_s - k * cfg.stats_interval_s > 0.5 * cfg.stats_interval_s:
        out.append((k * cfg.stats_interval_s, False))
        k += 1
    return out


def summary_event(groups: list[Group], ops: int, rng: random.Random, span: float = 1.0,
                  now: float | None = None) -> tuple[str, dict, float]:
    """A latency summary (``coll_stats``) of ``span`` seconds: ``ops`` rows, 20 calls of each
    op per second."""
    now = time.time() if now is None else now
    calls = max(1, round(20 * span))
    rows = []
    for i in range(ops):
        g = groups[i % len(groups)][0]
        base = 77 + (i % 5) * 6
        # Rounded as the agent sends them (pgdash_agent.wire.LatencySummary.row: to the nanosecond).
        rows.append({"group": g, "op": OPS[i % len(OPS)], "count": calls,
                     "bytes": calls * (4 << (20 - i)),
                     "sum_us": round(calls * 1000.0 * (1 + rng.random()), 3),
                     "max_us": round(4000.0 * (1 + rng.random()), 3),
                     "hist": [[base + j, 1 + rng.randrange(4)] for j in range(8)]})
    return ("coll_stats", {"start": now - span, "end": now, "rows": rows}, now)


def second_events(rank: int, step: int, groups: list[Group], ops: int, rng: random.Random,
                  entered: int | None = None, now: float | None = None, span: float = 1.0):
    """What an agent sends at a heartbeat, as ``(kind, body, t)``: a heartbeat (``entered`` per
    group; ``step * 20`` unless given), a latency summary of ``ops`` rows over the last
    ``span`` seconds and a GPU reading."""
    now = time.time() if now is None else now
    seq = step * 20 if entered is None else entered
    progress = [{"group": g[0], "entered": seq, "completed": seq,
                 "inflight_op": None, "inflight_since": None} for g in groups]
    stats = summary_event(groups, ops, rng, span, now)
    gpu = {"uuid": "GPU-0", "name": "NVIDIA H200", "lost": False, "reasons": [], "xids": [],
           "values": {"util_gpu": 97.0, "util_mem": 40.0, "mem_used": 7.1e10,
                      # NVML's whole degrees and milliwatts, as agent.gpu reports them
                      "mem_total": 1.4e11, "temp_c": float(61 + rng.randrange(3)),
                      "power_w": (600_000 + rng.randrange(50_000)) / 1000,
                      "power_limit_w": 700.0,
                      "sm_clock_mhz": 1980.0, "sm_clock_max_mhz": 1980.0,
                      "ecc_uncorrected": 0.0, "ecc_corrected": 0.0, "pcie_replay": 0.0,
                      "remapped_correctable": 0.0, "remapped_uncorrectable": 0.0,
                      "remap_pending": 0.0, "remap_failure": 0.0}}
    return [("heartbeat", {"groups": progress, "dropped": {}, "buffered": 0}, now),
            stats, ("gpu", gpu, now)]


def snapshot_answer(rank: int, groups: list[Group], ask: dict, now: float | None = None):
    """A rank's answer to the server's ``ask`` as ``(kind, body, t)``, the size of a real
    one (pgdash_agent.snapshots): the training thread 30 frames deep in a training loop, a
    data loader and a checkpoint writer thread, and where each group is."""
    now = time.time() if now is None else now

    def frames(n: int, where: str) -> list[dict]:
        return [{"file": f"/workspace/{where}/module_{i}.py", "line": 10 + i,
                 "function": f"{where}_{i}", "code": f"result = {where}_{i + 1}(batch, step)"}
                for i in range(n)]

    body = {"ask": ask["ask"], "asked_at": ask.get("at"), "reason": ask.get("reason"),
            "took_ms": 0.4, "threads": [
                {"name": "MainThread", "training": True, "frames": frames(30, "train")},
                {"name": "DataLoader", "frames": frames(12, "loader")},
                {"name": "checkpoint", "frames": frames(8, "ckpt")}],
            "groups": [{"group": g[0], "entered": 100, "completed": 99,
                        "inflight_op": "all_reduce", "inflight_since": now - 0.01}
                       for g in groups]}
    return [("snapshot", {k: v for k, v in body.items() if v is not None}, now)]
