"""The statuses the server gives ranks and jobs as it folds their events (the HTTP API's
``status`` fields). The server owns them; the agent never sends them."""

from __future__ import annotations

import enum


class TextEnum(str, enum.Enum):
    """An enum whose members are their strings: equal to, printed as and sent as them."""

    def __str__(self) -> str:
        return self.value


class RankStatus(TextEnum):
    """A rank's status as the server folds it (str-valued: equal to, and sent as, the string)."""

    INITIALIZING = "initializing"
    RUNNING = "running"
    EXITED = "exited"
    FAILED = "failed"
    LOST = "lost"


class JobStatus(TextEnum):
    """A job's status as the server folds it (str-valued, like RankStatus)."""

    INITIALIZING = "initializing"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"


ENDED = (JobStatus.FINISHED, JobStatus.FAILED)  # job statuses that no longer change by themselves
