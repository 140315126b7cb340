"""Search budgets and the typed reasons a search stops.

>>> Budget(time_s=60).exhausted_by(elapsed_s=61, states=0, results=0)
<StopReason.TIME: 'time budget spent'>
>>> Budget(states=10).exhausted_by(elapsed_s=0, states=3, results=0) is None
True
"""

from __future__ import annotations

import enum
import math
import numbers
from dataclasses import dataclass


class StopReason(enum.Enum):
    COMPLETE = "search space exhausted"
    TIME = "time budget spent"
    STATES = "state budget spent"
    RESULTS = "enough verified µGraphs found"
    INTERRUPTED = "interrupted"
    TARGET = "a µGraph the caller waited for was found"


@dataclass(frozen=True)
class Budget:
    """Limits of one search; ``None`` means no limit.

    ``states`` counts logical search states (kernel and block states, in the order a depth-first
    search visits them), so a search with a state budget returns the same result for any number of
    workers.  ``results`` stops after that many verified µGraphs (the first in search order).
    """

    time_s: float | None = None
    states: int | None = None
    results: int | None = None

    def __post_init__(self) -> None:
        from mirage.generator.space import SearchSpaceError

        time_s = self.time_s
        if time_s is not None and (isinstance(time_s, bool) or not isinstance(time_s, numbers.Real)
                                   or math.isnan(time_s) or time_s < 0):
            raise SearchSpaceError(f"the time budget (time_s, time_limit_s) must be None or a number of "
                                   f"seconds ≥ 0, such as 30, got {time_s!r}")
        for name, least in (("states", 0), ("results", 1)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)
                                      or value < least):
                raise SearchSpaceError(f"the budget's {name} must be None (no limit) or an integer "
                                       f"≥ {least}, got {value!r}")

    def exhausted_by(self, elapsed_s: float, states: int, results: int) -> StopReason | None:
        if self.time_s is not None and elapsed_s >= self.time_s:
            return StopReason.TIME
        if self.states is not None and states >= self.states:
            return StopReason.STATES
        if self.results is not None and results >= self.results:
            return StopReason.RESULTS
        return None

    def to_dict(self) -> dict:
        return {"time_s": self.time_s, "states": self.states, "results": self.results}

    @classmethod
    def from_dict(cls, data: dict) -> Budget:
        return cls(data.get("time_s"), data.get("states"), data.get("results"))
