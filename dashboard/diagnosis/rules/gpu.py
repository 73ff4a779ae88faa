"""Rules for GPU health: hardware faults (XIDs, ECC, remapping) and thermal/power throttling."""

from __future__ import annotations

from dashboard.diagnosis.core import Finding, Settings, Severity, finding
from dashboard.state import JobState

# XIDs that mean the hardware (not the program) failed; others are usually the program's
# own fault (13, 31, 43: an illegal access or a crashed kernel) and are reported as warnings.
HARDWARE_XIDS = {
    48: "double-bit ECC error", 61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt", 63: "ECC page retirement or row remapping recorded",
    64: "ECC row remapping failure", 74: "NVLink error", 79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate", 94: "contained ECC error",
    95: "uncontained ECC error", 119: "GSP RPC timeout", 120: "GSP error",
    140: "unrecovered ECC error",
}
APP_XIDS = {13: "graphics engine exception", 31: "GPU memory page fault",
            43: "GPU stopped processing", 45: "preemptive cleanup after an earlier error"}
_GPU_FAULTS = {"lost": "the GPU fell off the bus (NVML: GPU is lost)",
               "ecc": "uncorrectable ECC errors since the driver loaded",
               "remap_failure": "a memory row remapping failed",
               "remap_pending": "a memory row remapping is pending (needs a GPU reset)"}


def _fault_text(key: str) -> tuple[str, bool]:
    """(description, is hardware) of a GPU fault key."""
    if key.startswith("xid:"):
        xid = int(key[4:])
        if xid in HARDWARE_XIDS:
            return f"XID {xid} ({HARDWARE_XIDS[xid]})", True
        return f"XID {xid} ({APP_XIDS.get(xid, 'see the NVIDIA XID catalogue')})", False
    return _GPU_FAULTS[key], key != "remap_pending"


def gpu_fault(state: JobState, now: float, s: Settings) -> list[Finding]:
    out = []
    ranks = state.rank_index()
    for rank, faults in sorted(state.gpu_faults.items()):
        if not faults:
            continue
        described = {key: _fault_text(key) for key in faults}
        hardware = any(hw for _, hw in described.values())
        gpu = state.gpus.get(rank, {})
        host = (ranks.get(rank).host if ranks.get(rank) else None) or "its host"
        text = "; ".join(d for d, _ in described.values())
        out.append(finding(
            "gpu_fault", Severity.CRITICAL if hardware else Severity.WARNING, [rank], None,
            f"Rank {rank}'s GPU ({gpu.get('name') or 'GPU'} {gpu.get('uuid', '')}) on {host} "
            f"faulted: {text}.",
            (f"Take {host} out of the pool and check it: `nvidia-smi -q -d ECC,ROW_REMAPPER` "
             f"and `dmesg -T | grep -i xid` on {host}; XID 79, 95 or a remap failure need a GPU "
             "reset or an RMA. Restart the job without that GPU."
             if hardware else
             "These XIDs usually come from the program itself (an illegal memory access, a "
             "kernel that crashed): rerun that rank with CUDA_LAUNCH_BLOCKING=1 or under "
             "compute-sanitizer to find the kernel."),
            {"faults": {k: {"first_seen": t, "meaning": described[k][0]}
                        for k, t in sorted(faults.items())},
             "uuid": gpu.get("uuid"), "host": host},
            min(faults.values()), key=f"r{rank}"))
    return out


def gpu_throttle(state: JobState, now: float, s: Settings) -> list[Finding]:
    out = []
    for rank, since in sorted(state.throttled_since.items()):
        gpu = state.gpus.get(rank, {})
        reasons = [r for r in gpu.get("reasons", []) if r != "gpu_idle"]
        out.append(finding(
            "gpu_throttle", Severity.WARNING, [rank], None,
            f"Rank {rank}'s GPU is slowed down ({', '.join(reasons)}): SM clock "
            f"{gpu.get('sm_clock_mhz') or '?'} of {gpu.get('sm_clock_max_mhz') or '?'} MHz, "
            f"{gpu.get('temp_c') or '?'} °C, {gpu.get('power_w') or '?'} W.",
            "A throttled GPU makes its rank a straggler for the whole job. Check cooling and "
            "power on that host (`nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER`), fans, "
            "airflow and the power supply; a hardware slowdown that persists needs the host "
            "looked at.",
            {"reasons": reasons, "since": since, "temp_c": gpu.get("temp_c"),
             "power_w": gpu.get("power_w"), "sm_clock_mhz": gpu.get("sm_clock_mhz")},
            since + s.throttle_after, key=f"r{rank}"))
    return out
