"""The search's progress bar: units done, states per second, µGraphs found, pruned counts per rule."""

from __future__ import annotations

import time
from typing import Any

_REFRESH_S = 0.5


class Progress:
    def __init__(self, total: int, done: int, enabled: bool = True) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(
            total=total,
            initial=done,
            unit="unit",
            desc="µGraph search",
            disable=not enabled,
            dynamic_ncols=True,
            leave=False,
        )
        self.enabled = enabled
        self.executor: Any = None
        self.committer: Any = None
        self.stats: Any = None
        self.start = time.perf_counter()
        self.found = 0
        self.pruned: dict[str, int] = {}
        self._last = 0.0

    def bind(self, executor, committer, stats) -> None:
        self.executor, self.committer, self.stats = executor, committer, stats

    def unit_done(self, record: dict[str, Any]) -> None:
        self.bar.update(1)
        self.found += len(record["found"])
        for name, count in record["stats"]["pruned"].items():
            self.pruned[name] = self.pruned.get(name, 0) + count

    def refresh_soon(self) -> None:
        """Called from inside a serial search every few hundred states."""
        if time.perf_counter() - self._last > _REFRESH_S:
            self.refresh()

    def refresh(self) -> None:
        if not self.enabled or self.executor is None:
            return
        self._last = time.perf_counter()
        elapsed = max(self._last - self.start, 1e-9)
        top = sorted(self.pruned.items(), key=lambda kv: -kv[1])[:3]
        self.bar.set_postfix_str(
            f"{self.executor.live_states / elapsed:,.0f} states/s, found {self.found}, pruned "
            + ", ".join(f"{name} {count:,}" for name, count in top),
            refresh=True,
        )

    def close(self) -> None:
        self.bar.close()
