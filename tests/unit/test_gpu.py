"""GPU health: the sampler over a stand-in NVML, the fold, the rules and the API.

The real NVML path is exercised on a GPU machine by bench/gpu_check.py."""

from pgdash_agent.gpu import GpuSampler
from dashboard.web import views
from dashboard.web.live import sections
from dashboard.diagnosis import Settings, diagnose
from tests.helpers.fake_nvml import FakeNvml
from tests.helpers.events import Log, hello

S = Settings(lost_after=1e9)


def test_sampler_reads_every_field_and_converts_units():
    nvml = FakeNvml()
    sampler = GpuSampler("0000-fake", nvml)  # torch's uuid has no GPU- prefix
    assert sampler.start() and sampler.name == "NVIDIA Fake H200"
    reading = sampler.sample()
    v = reading["values"]
    assert v["util_gpu"] == 87 and v["temp_c"] == 61 and v["power_w"] == 412.0
    assert v["mem_total"] == 80 << 30 and v["ecc_corrected"] == 2
    assert v["remap_failure"] == 0 and reading["reasons"] == [] and reading["xids"] == []


def test_unsupported_fields_degrade_one_by_one_and_are_not_asked_again():
    nvml = FakeNvml()
    nvml.unsupported = {"power", "remapped_rows", "xid_events"}
    sampler = GpuSampler("GPU-0000-fake", nvml)
    sampler.start()
    first = sampler.sample()
    assert first["values"]["power_w"] is None and "remap_failure" not in first["values"]
    assert first["values"]["temp_c"] == 61
    asked = nvml.calls.count("power")
    sampler.sample()
    assert nvml.calls.count("power") == asked == 1
    assert {"power", "remapped_rows", "xid_events"} <= sampler.unsupported


def test_reasons_xids_and_a_lost_gpu():
    nvml = FakeNvml()
    sampler = GpuSampler("GPU-0000-fake", nvml)
    sampler.start()
    nvml.reasons = 0x4 | 0x40
    nvml.xids = [79, 48]
    reading = sampler.sample()
    assert reading["reasons"] == ["sw_power_cap", "hw_thermal_slowdown"]
    assert reading["xids"] == [79, 48] and sampler.sample()["xids"] == []
    nvml.lost = True
    reading = sampler.sample()
    assert reading["lost"] and reading["values"]["temp_c"] is None


def test_no_gpu_or_no_nvml_is_just_unavailable():
    sampler = GpuSampler("GPU-other", FakeNvml())
    assert not sampler.start() and "GPU-other" in sampler.error and sampler.sample() is None


def gpu_event(xids=(), reasons=(), lost=False, **values):
    base = {"util_gpu": 90.0, "temp_c": 60.0, "power_w": 400.0, "sm_clock_mhz": 1980.0,
            "sm_clock_max_mhz": 1980.0, "ecc_uncorrected": 0.0}
    return {"uuid": "GPU-1", "name": "H200", "lost": lost, "values": {**base, **values},
            "reasons": list(reasons), "xids": list(xids)}


def two_ranks():
    log = Log()
    for r in (0, 1):
        log.add(f"s{r}", "hello", hello(r, host=f"node{r}"), t=1)
    return log


def test_hardware_xid_is_a_critical_gpu_fault_on_that_rank():
    log = two_ranks().add("s1", "gpu", gpu_event(xids=[79]), t=10)
    (f,) = diagnose(log.state(), 11, S)
    assert f["kind"] == "gpu_fault" and f["ranks"] == [1] and f["severity"] == "critical"
    assert "fallen off the bus" in f["summary"] and "node1" in f["hint"]
    assert f["first_seen"] == 10


def test_application_xid_is_a_warning_and_ecc_is_critical():
    log = two_ranks().add("s0", "gpu", gpu_event(xids=[13]), t=10)
    (f,) = diagnose(log.state(), 11, S)
    assert f["severity"] == "warning" and "compute-sanitizer" in f["hint"]
    log.add("s0", "gpu", gpu_event(ecc_uncorrected=2.0), t=12)
    (f,) = diagnose(log.state(), 13, S)
    assert f["severity"] == "critical" and set(f["evidence"]["faults"]) == {"xid:13", "ecc"}


def test_throttling_must_last_before_it_is_a_finding():
    log = two_ranks()
    for t in range(10, 17):
        log.add("s0", "gpu", gpu_event(reasons=["sw_power_cap", "hw_thermal_slowdown"],
                                      temp_c=91.0, sm_clock_mhz=1100.0), t=t)
    assert diagnose(log.state(), 14.9, S) == []
    (f,) = diagnose(log.state(), 16, S)
    assert f["kind"] == "gpu_throttle" and f["ranks"] == [0] and f["first_seen"] == 15
    log.add("s0", "gpu", gpu_event(reasons=["sw_power_cap"]), t=17)  # power cap alone: normal
    assert diagnose(log.state(), 18, S) == []


def test_gpu_rows_have_latest_reading_and_history():
    log = two_ranks()
    for t in (10, 11):
        log.add("s1", "gpu", gpu_event(util_gpu=float(t)), t=t)
    (row,) = views.gpu_rows(log.state())
    assert row["rank"] == 1 and row["host"] == "node1" and row["util_gpu"] == 11.0
    assert [p[:2] for p in row["history"]] == [[10, 10.0], [11, 11.0]]
    # The page's section (live and state?at) leaves the history out: the page draws none.
    (shown,) = sections(log.state(), at=12.0)["gpus"]
    assert "history" not in shown and shown == {k: v for k, v in row.items() if k != "history"}
