"""What the jobs in tests/jobs/ do, as counts the server must show."""


def expected_counts(world: int) -> dict[tuple[str, str, int], int]:
    """The plan in tests/jobs/plan_job.py, counted independently of the job."""
    counts: dict[tuple[str, str, int], int] = {}
    for rank in range(world):
        counts[("0", "all_reduce", rank)] = 7 + 2
        counts[("0", "broadcast", rank)] = 3
        counts[("0", "all_gather", rank)] = 2 + 2
        counts[("0", "all_gather_single", rank)] = 1
        counts[("0", "barrier", rank)] = 1
    for rank in (0, 1):
        counts[("1", "all_reduce", rank)] = 5
    counts[("0", "send", 0)] = 2
    counts[("0", "isend", 0)] = 1
    counts[("0", "recv", 1)] = 2
    counts[("0", "irecv", 1)] = 1
    return counts
