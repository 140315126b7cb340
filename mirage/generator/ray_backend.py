"""The same work units on a Ray cluster (``pip install mirage[ray]``).

``search(..., backend="ray", ray_address="auto")`` connects to a running cluster (or, without an
address, starts a local Ray instance), puts the pickled search context in the object store once
and runs one Ray task per work unit; each Ray worker unpickles the context once and keeps its
caches.  Twice as many tasks as the cluster has CPUs stay in flight.  Results are committed in unit
order by the driver exactly as for worker processes, so a Ray search returns the same result set.
"""

from __future__ import annotations

import logging
import pickle
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from mirage.errors import MirageError
from mirage.generator.executors import past_deadline
from mirage.generator.explore import SearchContext
from mirage.generator.units import WorkUnit, run_unit

logger = logging.getLogger(__name__)


class RayUnavailableError(MirageError):
    """Ray is not installed; install the extra with ``pip install 'mirage[ray]'``."""


def _ray():
    try:
        import ray
    except ImportError:
        raise RayUnavailableError("backend='ray' needs the ray package: pip install 'mirage[ray]'") from None
    return ray


_CONTEXTS: dict[str, SearchContext] = {}  # per Ray worker process: unpickled once, caches kept


def _run_remote(key: str, blob: bytes, unit: WorkUnit, deadline: float | None, cap: int | None) -> dict:
    context = _CONTEXTS.get(key)
    if context is None:
        _CONTEXTS.clear()
        context = _CONTEXTS[key] = pickle.loads(blob)
    return run_unit(context, unit, deadline, cap)


class RayExecutor:
    name = "ray"

    def __init__(self, context: SearchContext, workers: int, address: str | None = None) -> None:
        ray = _ray()
        self._ray = ray
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"address": address} if address else {"num_cpus": workers}
            # workers import mirage from where this process does (a source checkout need not be installed)
            import mirage

            package_root = str(Path(mirage.__file__).resolve().parents[1])
            kwargs["runtime_env"] = {"env_vars": {"PYTHONPATH": package_root}}
            ray.init(ignore_reinit_error=True, log_to_driver=False, include_dashboard=False, **kwargs)
            logger.info("started Ray (%s)", address or f"local, {workers} CPUs")
        self.workers = max(1, int(ray.cluster_resources().get("CPU", workers)))
        self._key = uuid.uuid4().hex
        self._context = ray.put(pickle.dumps(context))
        self._task = ray.remote(num_cpus=1)(_run_remote)
        self._in_flight: dict[Any, WorkUnit] = {}
        self.live_states = 0

    def start(self) -> float:
        return 0.0  # Ray's workers start as tasks arrive; connecting to the cluster happened in __init__

    def results(self, units: Sequence[WorkUnit], deadline: float | None, cap) -> Iterator[dict | None]:
        ray = self._ray
        pending = iter(units)

        def fill() -> None:
            while len(self._in_flight) < 2 * self.workers and not past_deadline(deadline):
                unit = next(pending, None)
                if unit is None:
                    return
                self._in_flight[self._task.remote(self._key, self._context, unit, deadline, cap())] = unit

        fill()
        while self._in_flight:
            done, _ = ray.wait(list(self._in_flight), num_returns=1, timeout=0.5)
            for ref in done:
                self._in_flight.pop(ref)
                record = ray.get(ref)
                self.live_states += record["states"]
                yield record
            if not done:
                yield None
            fill()

    def close(self) -> None:
        for ref in list(self._in_flight):
            self._ray.cancel(ref, force=True)
        self._in_flight.clear()
