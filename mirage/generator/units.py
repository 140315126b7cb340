"""Work units: the subtrees of the search that run independently (on worker processes or Ray).

The root of the search (the reference's inputs) is expanded once; each of its children, a kernel
state after one pre-defined op or a block header of a graph-defined op, is a unit.  Units are listed
in depth-first order, so committing their results in index order reproduces the serial search.

A unit's result is a plain, JSON-serializable record (:func:`run_unit`): its verified µGraphs (with
the logical state index where each was found), its logical state count, why it stopped (``None``
when it finished), and its statistics.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from mirage.generator.explore import Explorer, SearchContext, StopSearch
from mirage.generator.state import BlockHeader, KernelState


@dataclass(frozen=True)
class WorkUnit:
    index: int
    kind: str  # "kernel": a kernel state; "header": a block header under ``state``
    state: KernelState
    header: BlockHeader | None = None
    depth: int = 1


def split(explorer: Explorer, root: KernelState) -> list[WorkUnit]:
    """The units below ``root`` (whose own visit the caller has done).  Interned type ids are
    per process, so states travel without them."""
    units: list[WorkUnit] = []
    portable_root = dataclasses.replace(root, type_ids=())
    for _kind, child in explorer.children(root):
        if isinstance(child, KernelState):
            units.append(WorkUnit(len(units), "kernel", dataclasses.replace(child, type_ids=())))
        else:
            units.append(WorkUnit(len(units), "header", portable_root, child))  # type: ignore[arg-type]
    return units


def _stats_dict(explorer: Explorer) -> dict[str, Any]:
    stats = dataclasses.asdict(explorer.stats)
    stats["states_per_depth"] = dict(explorer.stats.states_per_depth)
    stats["pruned"] = dict(explorer.stats.pruned)
    return stats


def run_unit(
    context: SearchContext, unit: WorkUnit, deadline: float | None, state_cap: int | None, progress=None
) -> dict[str, Any]:
    """Search one unit; the record is JSON-serializable (graphs in their JSON form)."""
    from mirage.mugraph.serialize import dumps

    context.rules.require_registered()
    start = time.perf_counter()
    explorer = Explorer(context, deadline, state_cap, progress)
    stop = None
    try:
        if unit.kind == "kernel":
            explorer.run_kernel(unit.state, unit.depth)
        else:
            explorer.run_header(unit.state, unit.header, unit.depth)  # type: ignore[arg-type]
    except StopSearch as reason:
        stop = reason.reason.value
    explorer.stats.seconds = time.perf_counter() - start
    return {
        "index": unit.index,
        "states": explorer.position,
        "stop": stop,
        "found": [
            {"graph": dumps(f.graph), "position": f.position, "elapsed_s": round(f.elapsed_s, 3)}
            for f in explorer.found
        ],
        "stats": _stats_dict(explorer),
    }
