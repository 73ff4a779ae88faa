"""A clock a test sets by hand (``clock.t``), for code that takes a ``clock`` callable."""

from __future__ import annotations


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t
