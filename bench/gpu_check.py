"""The GPU-only checks, for a machine with an NVIDIA GPU (CI has none).

1. Real NVML: ``pgdash_agent.gpu.GpuSampler`` on this machine's GPU 0 (every field, clock-event
   reasons, XID event registration).
2. NCCL with the agent: one rank, all_reduce on a CUDA tensor (sync and async_op) and DDP on
   the GPU, reporting to a real pgdash server in this process; the API must show exact
   counts, the CUDA device and UUID, the NCCL version, GPU readings and no finding.
3. The agent's cost on the training thread with NCCL: 1-float all_reduce, bare vs wrapped,
   alternating blocks (NCCL enqueue is asynchronous, so this is the wrapper's own cost).
4. A real NCCL error: two ranks on the same GPU; the text is classified by dashboard.diagnosis.errors.
5. Which Flight Recorder dump sees NCCL groups (``_dump_fr_trace_json`` vs
   ``_dump_nccl_trace_json``).

Run: ``python -m bench.gpu_check [--out DIR]``; prints a summary table last.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.common import ROOT, free_port

results: dict = {}


def check_nvml() -> None:
    import torch

    from pgdash_agent.gpu import GpuSampler

    uuid = str(torch.cuda.get_device_properties(0).uuid)
    sampler = GpuSampler(uuid)
    ok = sampler.start()
    readings = [sampler.sample() for _ in range(3)] if ok else []
    results["nvml"] = {"started": ok, "error": sampler.error, "name": sampler.name,
                       "uuid": sampler.uuid, "unsupported": sorted(sampler.unsupported),
                       "reading": readings[-1] if readings else None}
    sampler.close()


RANK_SCRIPT = r'''
import os, sys, time, json, torch, torch.distributed as dist
from pgdash_agent import attach  # PYTHONPATH is the checkout
mode = sys.argv[1]
torch.cuda.set_device(0)
agent = attach()
dist.init_process_group("nccl")
rank = dist.get_rank()
if mode == "job":
    t = torch.ones(1024, device="cuda")
    for _ in range(100):
        dist.all_reduce(t)
    for _ in range(20):
        dist.all_reduce(t, async_op=True).wait()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64).cuda())
    for _ in range(5):
        model(torch.randn(8, 64, device="cuda")).sum().backward()
    torch.cuda.synchronize()
    from torch._C import _distributed_c10d as c
    fr = {}
    for name in ("_dump_fr_trace_json", "_dump_nccl_trace_json"):
        fn = getattr(c, name, None)
        try:
            fr[name] = json.loads(fn(includeCollectives=False))["pg_status"] if fn else "absent"
        except Exception as exc:
            fr[name] = f"{type(exc).__name__}: {exc}"
    print("FR", json.dumps(fr), flush=True)
    print("PROBE", json.dumps(pgdash_agent.flight.read()), flush=True)
    time.sleep(2.5)  # GPU readings reach the server
elif mode == "overhead":
    t = torch.zeros(1, device="cuda")
    bare, wrapped = dist.all_reduce.__wrapped__, dist.all_reduce
    for _ in range(2000):
        wrapped(t)
    times = {"bare": [], "agent": []}
    for block in range(200):
        for label, fn in (("bare", bare), ("agent", wrapped), ("agent", wrapped), ("bare", bare)):
            start = time.perf_counter_ns()
            for _ in range(50):
                fn(t)
            times[label].append((time.perf_counter_ns() - start) / 50)
        torch.cuda.synchronize()
    print("OVERHEAD", json.dumps({k: sorted(v)[len(v) // 2] for k, v in times.items()}),
          flush=True)
elif mode == "same-gpu":
    try:
        dist.all_reduce(torch.ones(4, device="cuda"))
        torch.cuda.synchronize()
        print("NO-ERROR", flush=True)
    except Exception as exc:
        print("ERROR", json.dumps({"type": type(exc).__name__, "text": str(exc)}), flush=True)
dist.destroy_process_group()
'''


def run_ranks(server_url: str, job: str, mode: str, world: int, tmp: Path,
              timeout: float = 150) -> list[str]:
    script = tmp / "rank.py"
    script.write_text(RANK_SCRIPT)
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, PGDASH_SERVER=server_url,
                   PGDASH_JOB=job, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        procs.append(subprocess.Popen([sys.executable, str(script), mode], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = []
    try:
        for p in procs:
            try:
                out, _ = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                out = f"TIMEOUT after {timeout}s\n" + (p.communicate()[0] or "")
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return outs


def api(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def main() -> int:
    out_dir = Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else None
    import torch

    results["torch"] = torch.__version__
    results["cuda"] = torch.version.cuda
    results["gpu"] = torch.cuda.get_device_name(0)
    check_nvml()
    from dashboard.server import make_server
    from dashboard.diagnosis.errors import classify

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        server = make_server(f"sqlite:///{tmp / 'gpu.db'}", "127.0.0.1", 0).start()
        try:
            outs = run_ranks(server.url, "nccl-job", "job", 1, tmp)
            fr_line = next((l for l in outs[0].splitlines() if l.startswith("FR ")), None)
            results["flight_recorder"] = json.loads(fr_line[3:]) if fr_line else outs[0][-2000:]
            probe = next((l for l in outs[0].splitlines() if l.startswith("PROBE ")), None)
            results["agent_flight_probe"] = json.loads(probe[6:]) if probe else None
            time.sleep(1.5)
            job = next(j for j in api(server.url + "/api/jobs")["jobs"] if j["name"] == "nccl-job")
            detail = api(f"{server.url}/api/jobs/{job['id']}")
            rows = api(f"{server.url}/api/jobs/{job['id']}/collectives")["collectives"]
            gpus = api(f"{server.url}/api/jobs/{job['id']}/gpus")["gpus"]
            findings = api(f"{server.url}/api/jobs/{job['id']}/findings")["findings"]
            state = server.services.ingest.read(job["id"], lambda s: s.ranks()[0])
            results["nccl_job"] = {
                "status": job["status"], "backend": job["backend"],
                "rank": detail["ranks"][0], "versions": state.versions,
                "counts": {f"{r['group']}/{r['op']}": r["count"] for r in rows},
                "p50_us": {f"{r['group']}/{r['op']}": r["p50_us"] for r in rows},
                "gpu_rows": len(gpus), "gpu_latest": {k: v for k, v in (gpus[0] if gpus else {})
                                                      .items() if k != "history"},
                "findings": [(f["kind"], f["ranks"]) for f in findings]}
            outs = run_ranks(server.url, "overhead", "overhead", 1, tmp)
            line = next((l for l in outs[0].splitlines() if l.startswith("OVERHEAD ")), None)
            results["overhead_ns"] = json.loads(line[9:]) if line else outs[0][-2000:]
            outs = run_ranks(server.url, "same-gpu", "same-gpu", 2, tmp, timeout=60)
            errors = [json.loads(l[6:]) for o in outs for l in o.splitlines()
                      if l.startswith("ERROR ")]
            results["same_gpu"] = [{"type": e["type"], "text": e["text"][:600],
                                    "cause": classify(e["text"], e["type"]).cause}
                                   for e in errors] or [o[-1500:] for o in outs]
            time.sleep(2)
            job = next(j for j in api(server.url + "/api/jobs")["jobs"] if j["name"] == "same-gpu")
            results["same_gpu_findings"] = [
                (f["kind"], f["ranks"], f["summary"])
                for f in api(f"{server.url}/api/jobs/{job['id']}/findings")["findings"]]
        finally:
            server.stop()
    text = json.dumps(results, indent=1, default=str)
    if out_dir:
        (out_dir / "gpu_check.json").write_text(text)
    print(text)
    j = results.get("nccl_job", {})
    o = results.get("overhead_ns", {})
    print("\nSUMMARY")
    print(f"nvml started={results['nvml']['started']} unsupported={results['nvml']['unsupported']}")
    print(f"nccl job: status={j.get('status')} counts={j.get('counts')} gpu_rows={j.get('gpu_rows')}"
          f" findings={j.get('findings')}")
    if isinstance(o, dict):
        print(f"overhead: bare {o['bare']:.0f} ns, agent {o['agent']:.0f} ns per call "
              f"(+{o['agent'] - o['bare']:.0f} ns)")
    print(f"agent's Flight Recorder probe on NCCL: {results.get('agent_flight_probe')}")
    print(f"same gpu: {[(e.get('type'), e.get('cause')) if isinstance(e, dict) else e[:200] for e in results['same_gpu']]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
