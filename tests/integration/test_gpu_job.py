"""GPU health end to end: a real gloo job whose agent samples a stand-in NVML (XID 79)
reaches the API and the findings."""


def test_agent_gpu_readings_reach_the_api_and_the_findings(server, tmp_path):
    from tests.helpers.procs import job_by_name, launch_job, wait_for, wait_job

    assert wait_job(launch_job("fake_gpu_job.py", 1, server.url, "gpu", tmp_path), 60,
                    tmp_path) == [0]
    job = wait_for(lambda: job_by_name(server, "gpu"), 10, "the job")
    (row,) = server.api(f"/api/jobs/{job['id']}/gpus")["gpus"]
    assert row["rank"] == 0 and row["uuid"] == "GPU-0000-fake" and row["util_gpu"] == 87
    assert row["name"] == "NVIDIA Fake H200" and len(row["history"]) >= 2
    found = server.api(f"/api/jobs/{job['id']}/findings")["findings"]
    assert [(f["kind"], f["ranks"], f["severity"]) for f in found] == [
        ("gpu_fault", [0], "critical")]
