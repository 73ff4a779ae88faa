"""The pure core's state: a job as a fold over its event log (no Flask, no SQL, no clock).

- ``records``: an event as the log holds it, a rank's session, a job's status from its ranks;
- ``latency``: latency summaries merged (totals, per-second series);
- ``recent``: the slowness rules' windows, every (group, rank)'s newest summaries as arrays;
- ``fold``: the job's data and one handler per event kind (where a new kind is folded);
- ``job``: JobState, the fold plus what the API, the page and diagnosis ask of it.

The names below are the package's surface: import them from ``dashboard.state``. Checkpoints
stored before the package was split name ``dashboard.state.JobState`` (and RankState,
LatencyStats) and still load through these names.
"""

from dashboard.state.fold import THROTTLE_REASONS, StateObserver
from dashboard.state.job import JobState
from dashboard.state.latency import LatencyStats, quantile_us
from dashboard.state.records import (FLIGHT_OP, TERMINAL_RANK, RankState, StoredEvent,
                                     family_of, group_order, rank_row)

__all__ = ["FLIGHT_OP", "TERMINAL_RANK", "THROTTLE_REASONS", "JobState", "LatencyStats",
           "RankState", "StateObserver", "StoredEvent", "family_of", "group_order",
           "quantile_us", "rank_row"]
