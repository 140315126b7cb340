"""The statistics record of one search, saved as JSON beside its results.

>>> stats = SearchStatistics()
>>> stats.add_unit({"kernel_states": 3, "block_states": 10, "states_per_depth": {"kernel:0": 3},
...                 "pruned": {"shape": 2}, "verify_calls": 1, "verify_s": 0.5})
>>> stats.states_per_level, stats.pruned
({'kernel': 3, 'block': 10}, {'shape': 2})
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class SearchStatistics:
    states_per_level: dict[str, int] = field(default_factory=lambda: {"kernel": 0, "block": 0})
    states_per_depth: dict[str, int] = field(default_factory=dict)  # "kernel:2", "block:5"
    block_states_searched: int = 0  # block states visited (the rest came from the body memo)
    pruned: dict[str, int] = field(default_factory=dict)  # per rule
    verify_calls: int = 0  # complete candidates checked against the reference
    verified: int = 0  # µGraphs found
    # setup, search (the workers' start-up included), workers (their start-up), verify, rank
    phase_seconds: dict[str, float] = field(default_factory=dict)
    units_total: int = 0
    units_done: int = 0
    units_resumed: int = 0  # taken from a checkpoint
    units_listing_truncated: bool = False  # the root's listing stopped at driver.LISTING_SHARE of the budget
    workers: int = 1
    backend: str = "serial"
    wall_seconds: float = 0.0
    first_found_s: float | None = None
    stop_reason: str = ""
    checker: str = ""
    oracle: str = ""
    space_hash: str = ""
    graph_hash: str = ""
    machine: dict[str, Any] = field(default_factory=dict)

    @property
    def states(self) -> int:
        return sum(self.states_per_level.values())

    @property
    def states_per_second(self) -> float:
        seconds = self.phase_seconds.get("search", 0.0)
        return self.states / seconds if seconds > 0 else 0.0

    def add_unit(self, unit: dict[str, Any]) -> None:
        """Fold in the statistics of one work unit (``explore.UnitStats`` as a dict)."""
        self.states_per_level["kernel"] += unit.get("kernel_states", 0)
        self.states_per_level["block"] += unit.get("block_states", 0)
        self.block_states_searched += unit.get("block_states_searched", 0)
        self.states_per_depth = dict(
            Counter(self.states_per_depth) + Counter(unit.get("states_per_depth", {}))
        )
        self.pruned = dict(Counter(self.pruned) + Counter(unit.get("pruned", {})))
        self.verify_calls += unit.get("verify_calls", 0)
        self.phase_seconds["verify"] = self.phase_seconds.get("verify", 0.0) + unit.get("verify_s", 0.0)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["states"] = self.states
        data["states_per_second"] = round(self.states_per_second, 1)
        data["states_per_depth"] = dict(sorted(self.states_per_depth.items(), key=_depth_key))
        data["pruned"] = dict(sorted(self.pruned.items(), key=lambda kv: -kv[1]))
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SearchStatistics:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    def summary(self) -> str:
        top = ", ".join(f"{k} {v}" for k, v in sorted(self.pruned.items(), key=lambda kv: -kv[1])[:4])
        return (
            f"{self.states} states ({self.states_per_level['kernel']} kernel, "
            f"{self.states_per_level['block']} block) in {self.wall_seconds:.1f} s, "
            f"{self.verify_calls} checked, {self.verified} verified; pruned: {top}; "
            f"stopped: {self.stop_reason}"
        )


def _depth_key(item: tuple[str, int]) -> tuple[bool, int]:
    level, _, depth = item[0].partition(":")
    return (level != "kernel", int(depth or 0))
