"""GPU health of this rank's GPU from NVML (``nvidia-ml-py``, imported as ``pynvml``).

Every field degrades on its own: a query the driver does not support (``NVMLError_NotSupported``,
``NVMLError_FunctionNotFound`` for bindings newer than the driver) is dropped for good and the
others go on; a GPU that fell off the bus (``NVMLError_GPUIsLost``) is reported as ``lost``.
Without a GPU, or without ``pynvml``, the sampler is simply unavailable. The NVML module is
injected through the constructor, so tests pass a fake one and the real one is checked on a
machine with a GPU (``bench/gpu_check.py``).

The GPU is found by UUID (``torch.cuda.get_device_properties(i).uuid``), not by index: NVML
ignores ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

from typing import Any

# nvmlClocksEventReason* bits (nvml.h; the older "ThrottleReason" names have the same values).
CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
    0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# What NVML errors mean for one field: gone for good, or this GPU is gone.
_UNSUPPORTED = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound",
                "NVMLError_InvalidArgument", "NVMLError_NoPermission")
_LOST = ("NVMLError_GpuIsLost", "NVMLError_GPUIsLost")


class GpuSampler:
    """Samples one GPU; every method returns quietly, whatever the driver does.

    Args:
        uuid: the GPU's UUID as torch prints it (with or without the ``GPU-`` prefix).
        nvml: the ``pynvml`` module or a stand-in with the same functions.
    """

    def __init__(self, uuid: str, nvml: Any = None):
        self.uuid = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        self.nvml = nvml
        self.handle = None
        self.name: str | None = None
        self.error: str | None = None
        self.unsupported: set[str] = set()
        self.lost = False
        self._events = None

    def start(self) -> bool:
        try:
            if self.nvml is None:
                import pynvml

                self.nvml = pynvml
            self.nvml.nvmlInit()
            self.handle = self.nvml.nvmlDeviceGetHandleByUUID(self.uuid.encode())
            name = self.nvml.nvmlDeviceGetName(self.handle)
            self.name = name.decode() if isinstance(name, bytes) else str(name)
        except Exception as exc:
            self.error = f"NVML unavailable for {self.uuid}: {type(exc).__name__}: {exc}"
            self.handle = None
            return False
        self._events = self._register_xid_events()
        return True

    def _register_xid_events(self):
        nv = self.nvml
        try:
            events = nv.nvmlEventSetCreate()
            nv.nvmlDeviceRegisterEvents(self.handle, nv.nvmlEventTypeXidCriticalError, events)
            return events
        except Exception:
            self.unsupported.add("xid_events")
            return None

    def _query(self, field: str, fn: str, *args: Any) -> Any:
        if field in self.unsupported or self.lost:
            return None
        try:
            return getattr(self.nvml, fn)(self.handle, *args)
        except Exception as exc:
            kind = type(exc).__name__
            if kind in _LOST:
                self.lost = True
            elif kind in _UNSUPPORTED or isinstance(exc, AttributeError):
                self.unsupported.add(field)
            return None

    def sample(self) -> dict[str, Any] | None:
        """One reading: numbers (None where unavailable), clock-event reasons, new XIDs."""
        if self.handle is None:
            return None
        nv = self.nvml
        util = self._query("util", "nvmlDeviceGetUtilizationRates")
        memory = self._query("memory", "nvmlDeviceGetMemoryInfo")
        reasons = self._query("clock_reasons", "nvmlDeviceGetCurrentClocksEventReasons")
        remapped = self._query("remapped_rows", "nvmlDeviceGetRemappedRows")
        power = self._query("power", "nvmlDeviceGetPowerUsage")
        limit = self._query("power_limit", "nvmlDeviceGetEnforcedPowerLimit")
        values = {
            "util_gpu": getattr(util, "gpu", None), "util_mem": getattr(util, "memory", None),
            "mem_used": getattr(memory, "used", None), "mem_total": getattr(memory, "total", None),
            "temp_c": self._query("temp", "nvmlDeviceGetTemperature",
                                  getattr(nv, "NVML_TEMPERATURE_GPU", 0)),
            "power_w": power / 1000 if power is not None else None,
            "power_limit_w": limit / 1000 if limit is not None else None,
            "sm_clock_mhz": self._query("sm_clock", "nvmlDeviceGetClockInfo",
                                        getattr(nv, "NVML_CLOCK_SM", 1)),
            "sm_clock_max_mhz": self._query("sm_clock_max", "nvmlDeviceGetMaxClockInfo",
                                            getattr(nv, "NVML_CLOCK_SM", 1)),
            "ecc_uncorrected": self._query(
                "ecc_uncorrected", "nvmlDeviceGetTotalEccErrors",
                getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
                getattr(nv, "NVML_VOLATILE_ECC", 0)),
            "ecc_corrected": self._query(
                "ecc_corrected", "nvmlDeviceGetTotalEccErrors",
                getattr(nv, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0),
                getattr(nv, "NVML_VOLATILE_ECC", 0)),
            "pcie_replay": self._query("pcie_replay", "nvmlDeviceGetPcieReplayCounter"),
        }
        if remapped is not None:
            values["remapped_correctable"], values["remapped_uncorrectable"], \
                values["remap_pending"], values["remap_failure"] = (int(v) for v in remapped[:4])
        return {"uuid": self.uuid, "name": self.name, "lost": self.lost,
                "values": {k: (float(v) if v is not None else None) for k, v in values.items()},
                "reasons": [name for bit, name in CLOCK_EVENT_REASONS.items()
                            if reasons is not None and int(reasons) & bit],
                "xids": self._drain_xids()}

    def _drain_xids(self) -> list[int]:
        xids: list[int] = []
        if self._events is None or self.lost:
            return xids
        for _ in range(64):  # bounded: a storm of XIDs still leaves the loop
            try:
                data = self.nvml.nvmlEventSetWait_v2(self._events, 0)
            except Exception:
                break  # NVMLError_Timeout: nothing pending
            xids.append(int(data.eventData))
        return xids

    def close(self) -> None:
        try:
            if self._events is not None:
                self.nvml.nvmlEventSetFree(self._events)
            if self.handle is not None:
                self.nvml.nvmlShutdown()
        except Exception:
            pass
