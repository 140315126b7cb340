"""Where work units run: in this process, on a pool of worker processes, or on a Ray cluster.

Every executor has the same interface: :meth:`results` runs the given units and yields each unit's
record as it finishes, and yields ``None`` about twice a second so that the driver can refresh its
progress bar and write checkpoints; it starts no unit once the deadline has passed, so that after
the deadline it ends when the units in flight have returned their (partial) records;
:attr:`live_states` is a live count of states visited; :meth:`close` stops outstanding work;
:meth:`start` readies the workers and returns the seconds it took, which the driver adds to the
search's deadline: starting workers is not searching.

Worker processes start from a fork server (a clean process, so no lock held by another thread of
this one is copied into them), which imports the heavy modules once (:data:`PRELOAD`), and receive
the search context once, pickled: each saturates the target's e-graph and draws the verifier's tests
again (same seed), which takes about a second.
Each worker limits the BLAS and OpenMP pools it loads (the verifier's float64 products) to its share
of the cores: left at one thread a core in every worker, 16 workers on 16 cores may run 256 threads.
A search of a large attention with 16 workers on a 16-core host checked 6 candidates in 41 s,
against 154 in 30 s with 2 workers on 2 cores; with this limit (and the slice check), 578 in 30 s.
Whatever the context holds is imported in every worker as it is unpickled: keep callables such as
``keep_when`` in modules that do not import torch (a worker importing it started its first unit
10–14 s into a 15 s search on that host).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

from mirage.errors import MirageError
from mirage.generator.budget import StopReason
from mirage.generator.explore import SearchContext, StopSearch
from mirage.generator.space import SearchSpaceError
from mirage.generator.units import WorkUnit, run_unit

logger = logging.getLogger(__name__)

CapFunction = Callable[[], "int | None"]
# modules the fork server imports once, so that each worker forks with them instead of importing them
# again: the main program (which workers prepare, and which may import torch), torch, galois (the
# verifier's finite fields) and egglog. A missing one is skipped. On a 2-core host, with 16 workers a
# search of BERT's output block took 17.8 s of an 8 s budget and visited 1 state with only this module
# preloaded, 10.0 s and 10,788 states with these; with 4 workers 11,356 states against 29,829
PRELOAD = ("__main__", "mirage.generator.executors", "torch", "galois", "egglog")
TICK_S = 0.5
_SERIAL_FALLBACK_SAID: list[bool] = []  # make_executor has said why searches run in this process


class SerialExecutor:
    """Runs units one after the other in this process (``workers=1``)."""

    name = "serial"

    def __init__(self, context: SearchContext, on_progress: Callable[[], None] | None = None) -> None:
        self.context = context
        self.live_states = 0
        self.on_progress = on_progress
        self._stopped = False

    def _progress(self, states: int) -> None:
        self.live_states += states
        if self.on_progress is not None:
            self.on_progress()
        if self._stopped:
            raise StopSearch(StopReason.INTERRUPTED)

    def start(self) -> float:
        return 0.0

    def results(
        self, units: Sequence[WorkUnit], deadline: float | None, cap: CapFunction
    ) -> Iterator[dict[str, Any] | None]:
        for unit in units:
            if self._stopped or past_deadline(deadline):
                return
            yield run_unit(self.context, unit, deadline, cap(), self._progress)

    def close(self) -> None:
        self._stopped = True


# ---- worker processes ------------------------------------------------------------------------------

_WORKER: dict[str, Any] = {}


def _exit_with_parent() -> None:
    """End this worker when the process that started the search is gone (killed, out of memory): a
    worker waiting on its task queue would otherwise outlive it, and hold the fork server too."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os._exit(1)

    threading.Thread(target=watch, name="mirage-parent-watch", daemon=True).start()


def _init_worker(context: SearchContext, counter, stop_flag, threads: int) -> None:
    _exit_with_parent()
    _WORKER.update(context=context, counter=counter, stop=stop_flag)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # a dependency; without it the search runs, its workers' pools unlimited
        return
    # kept referenced: the limits hold until the object is used to restore them
    _WORKER["limits"] = threadpool_limits(threads)


def threads_per_worker(workers: int) -> int:
    """BLAS/OpenMP threads for each of ``workers`` worker processes: an equal share of the cores."""
    return max(1, (os.cpu_count() or 1) // workers)


def _worker_progress(states: int) -> None:
    counter = _WORKER["counter"]
    with counter.get_lock():
        counter.value += states
    if _WORKER["stop"].value:
        raise StopSearch(StopReason.INTERRUPTED)


def _ready() -> str | None:
    """Run in each worker as it starts: what keeps it from searching (rules it lacks), or None."""
    rules = getattr(_WORKER.get("context"), "rules", None)
    try:
        if rules is not None:
            rules.require_registered()
    except MirageError as error:
        return str(error)
    return None


def _run_in_worker(unit: WorkUnit, deadline: float | None, cap: int | None) -> dict[str, Any]:
    return run_unit(_WORKER["context"], unit, deadline, cap, _worker_progress)


class ProcessExecutor:
    """Runs units on ``workers`` processes, keeping twice as many units in flight."""

    name = "processes"

    def __init__(self, context: SearchContext, workers: int) -> None:
        # A fork server starts workers from a clean process: forking this one could copy locks held
        # by its other threads (BLAS pools, the e-graph library) and deadlock the workers.
        methods = multiprocessing.get_all_start_methods()
        mp = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        if mp.get_start_method() == "forkserver":
            mp.set_forkserver_preload(list(PRELOAD))
        self.workers = workers
        self._counter = mp.Value("q", 0)
        self._stop = mp.Value("b", 0)
        self._pool = ProcessPoolExecutor(
            workers, mp_context=mp, initializer=_init_worker,
            initargs=(context, self._counter, self._stop, threads_per_worker(workers)),
        )

    @property
    def live_states(self) -> int:
        return int(self._counter.value)

    def start(self) -> float:
        """Start every worker and wait until each has run its initializer; the seconds waited.  The
        first pool of a process also waits for the fork server's imports (:data:`PRELOAD`: 2 s on a
        2-core host, more where torch loads CUDA's libraries), which a 8 s search on a 16-core GPU
        host spent before its first unit, visiting 2 states; each pool's workers then unpickle the
        search context (about a second)."""
        begun = time.time()
        # each submission finding no idle worker starts one, so this starts them all
        ready = [self._pool.submit(_ready) for _ in range(self.workers)]
        wait(ready)
        problem = next((f.result() for f in ready if f.result() is not None), None)
        if problem is not None:
            raise SearchSpaceError(problem)
        return time.time() - begun

    def results(
        self, units: Sequence[WorkUnit], deadline: float | None, cap: CapFunction
    ) -> Iterator[dict[str, Any] | None]:
        pending = iter(units)
        in_flight: dict[Future, WorkUnit] = {}

        def fill() -> None:
            while len(in_flight) < 2 * self.workers and not self._stop.value and not past_deadline(deadline):
                unit = next(pending, None)
                if unit is None:
                    return
                in_flight[self._pool.submit(_run_in_worker, unit, deadline, cap())] = unit

        fill()
        while in_flight:
            done, _ = wait(in_flight, timeout=TICK_S, return_when=FIRST_COMPLETED)
            for future in done:
                in_flight.pop(future)
                yield future.result()
            if not done:
                yield None
            fill()

    def close(self) -> None:
        self._stop.value = 1
        self._pool.shutdown(wait=True, cancel_futures=True)


def past_deadline(deadline: float | None) -> bool:
    return deadline is not None and time.time() > deadline


def make_executor(
    context: SearchContext,
    backend: str,
    workers: int,
    on_progress: Callable[[], None] | None = None,
    ray_address: str | None = None,
):
    if backend == "ray":
        from mirage.generator.ray_backend import RayExecutor

        return RayExecutor(context, workers, ray_address)
    if backend == "serial" or workers <= 1:
        return SerialExecutor(context, on_progress)
    if not main_importable():
        log = logger.warning if not _SERIAL_FALLBACK_SAID else logger.debug  # once a process
        _SERIAL_FALLBACK_SAID.append(True)
        log("mirage: searches run in this process instead of on %d worker processes: the main program "
            "was read from standard input (or its file is gone), and workers start by running the main "
            "program's file again. Run it from a file (python script.py) to search in parallel", workers)
        return SerialExecutor(context, on_progress)
    return ProcessExecutor(context, workers)


def main_importable() -> bool:
    """Whether worker processes started by a fork server or by spawn can prepare ``__main__``: they
    import it by its module name (``python -m``) or run its file again (a script), and have nothing to
    run for a program read from standard input (``python - <<EOF``: the file ``<stdin>``). Without a
    file (the interactive interpreter, a notebook) they start without it."""
    main = sys.modules.get("__main__")
    if main is None or getattr(getattr(main, "__spec__", None), "name", None):
        return True
    path = getattr(main, "__file__", None)
    if path is None:
        return True
    original = multiprocessing.process.ORIGINAL_DIR
    if not os.path.isabs(path) and original is not None:
        path = os.path.join(original, path)
    return os.path.isfile(path)
