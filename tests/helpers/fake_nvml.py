"""A stand-in for the ``pynvml`` module, for machines without a GPU.

It implements exactly the calls agent.gpu makes, with the real module's return shapes and
error classes by name; tests set ``values``, ``reasons``, ``xids``, ``unsupported`` and ``lost``.
"""

import types


class NVMLError(Exception):
    pass


def _error(name):
    return type(name, (NVMLError,), {})


NVMLError_NotSupported = _error("NVMLError_NotSupported")
NVMLError_GpuIsLost = _error("NVMLError_GpuIsLost")
NVMLError_Timeout = _error("NVMLError_Timeout")
NVMLError_NotFound = _error("NVMLError_NotFound")


class FakeNvml:
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 8

    def __init__(self, uuid="GPU-0000-fake"):
        self.uuid = uuid
        self.values = {"util_gpu": 87, "util_mem": 40, "mem_used": 30 << 30,
                       "mem_total": 80 << 30, "temp_c": 61, "power_mw": 412_000,
                       "limit_mw": 700_000, "sm_clock": 1980, "sm_clock_max": 1980,
                       "ecc_unc": 0, "ecc_cor": 2, "pcie_replay": 0,
                       "remapped": (0, 0, 0, 0)}
        self.reasons = 0
        self.xids: list[int] = []
        self.unsupported: set[str] = set()
        self.lost = False
        self.calls: list[str] = []

    def _get(self, name, key):
        self.calls.append(name)
        if self.lost:
            raise NVMLError_GpuIsLost()
        if name in self.unsupported:
            raise NVMLError_NotSupported()
        return self.values[key]

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid.decode() != self.uuid:
            raise NVMLError_NotFound()
        return "handle"

    def nvmlDeviceGetName(self, handle):
        return "NVIDIA Fake H200"

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=self._get("util", "util_gpu"),
                                     memory=self.values["util_mem"])

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(used=self._get("memory", "mem_used"),
                                     total=self.values["mem_total"])

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._get("temp", "temp_c")

    def nvmlDeviceGetPowerUsage(self, h):
        return self._get("power", "power_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._get("power_limit", "limit_mw")

    def nvmlDeviceGetClockInfo(self, h, clock):
        return self._get("sm_clock", "sm_clock")

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        return self._get("sm_clock_max", "sm_clock_max")

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        self._get("clock_reasons", "sm_clock")
        return self.reasons

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        return self._get("ecc", "ecc_unc" if kind == 1 else "ecc_cor")

    def nvmlDeviceGetPcieReplayCounter(self, h):
        return self._get("pcie_replay", "pcie_replay")

    def nvmlDeviceGetRemappedRows(self, h):
        return self._get("remapped_rows", "remapped")

    def nvmlEventSetCreate(self):
        return "events"

    def nvmlDeviceRegisterEvents(self, h, kinds, events):
        if "xid_events" in self.unsupported:
            raise NVMLError_NotSupported()

    def nvmlEventSetWait_v2(self, events, timeout_ms):
        if not self.xids:
            raise NVMLError_Timeout()
        return types.SimpleNamespace(eventType=8, eventData=self.xids.pop(0), device="handle")

    def nvmlEventSetFree(self, events):
        pass
