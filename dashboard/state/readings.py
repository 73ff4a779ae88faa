"""A rank's newest GPU readings as one ring of float64s, not a Python list per reading.

The fold keeps GPU_HISTORY readings per rank (``[t, util_gpu, mem_used, temp_c, power_w]``,
GET /api/jobs/<id>'s ``gpus[].history``). As a deque of five-item lists with their floats
they were 16 KB per rank, a quarter of a 1,024-rank job's state (bench/state_size.py); as
one array they are 8 bytes a number. The wire's numbers are finite (pgdash_agent.wire's
``_Num``), so NaN stands for a value NVML could not tell (None).
"""

from __future__ import annotations

from array import array
from typing import Iterable, Iterator

FIELDS = 5  # t, util_gpu, mem_used, temp_c, power_w
_UNKNOWN = float("nan")


class GpuHistory:
    """The newest ``size`` readings, oldest first when iterated (each a list, None where
    unknown), as a deque with that maxlen of such lists would give them."""

    __slots__ = ("size", "values", "start")

    def __init__(self, size: int, rows: Iterable[list] = ()):
        self.size = size
        self.values = array("d")  # reading k at [k * FIELDS, (k + 1) * FIELDS)
        self.start = 0  # the oldest reading's index, once the ring is full
        for row in rows:
            self.append(row)

    def append(self, row: list) -> None:
        numbers = array("d", [_UNKNOWN if v is None else v for v in row])
        if len(self.values) < self.size * FIELDS:
            self.values.extend(numbers)
            return
        at = self.start * FIELDS
        self.values[at:at + FIELDS] = numbers
        self.start = (self.start + 1) % self.size

    def __len__(self) -> int:
        return len(self.values) // FIELDS

    def __iter__(self) -> Iterator[list]:
        values, n = self.values, len(self)
        for k in range(n):
            at = (self.start + k) % n * FIELDS
            yield [None if v != v else v for v in values[at:at + FIELDS]]

    def __getstate__(self) -> tuple[int, int, bytes]:
        # The numbers as bytes: a checkpoint's unpickler allows only the state's own classes
        # (dashboard.storage.codec), not array's reconstructor.
        return self.size, self.start, self.values.tobytes()

    def __setstate__(self, state: tuple[int, int, bytes]) -> None:
        self.size, self.start, raw = state
        self.values = array("d")
        self.values.frombytes(raw)
