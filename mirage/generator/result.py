"""The result of a search: verified µGraphs ranked by the cost model, with the search statistics."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mirage.generator.budget import Budget, StopReason
from mirage.generator.cost import estimated_time_us, structure
from mirage.generator.space import SearchSpace
from mirage.generator.stats import SearchStatistics
from mirage.mugraph.graph import KernelGraph


@dataclass(frozen=True)
class FoundGraph:
    graph: KernelGraph
    elapsed_s: float  # seconds after the search started that it was verified
    estimated_us: float = 0.0

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> FoundGraph:
        from mirage.mugraph.serialize import loads

        graph = record["graph"]
        if isinstance(graph, str):
            graph = loads(graph)
        return cls(graph, float(record["elapsed_s"]), estimated_time_us(graph))

    @property
    def structure(self):
        return structure(self.graph)

    def to_dict(self) -> dict[str, Any]:
        from mirage.mugraph.serialize import graph_to_dict

        return {
            "graph": graph_to_dict(self.graph),
            "elapsed_s": self.elapsed_s,
            "estimated_us": round(self.estimated_us, 3),
            "hash": self.graph.content_hash(),
        }


@dataclass
class SearchResult:
    """Verified µGraphs, cheapest first (``graphs``), each with when it was found (``found``)."""

    reference: KernelGraph
    space: SearchSpace
    found: list[FoundGraph]
    stats: SearchStatistics
    stop_reason: StopReason
    key: str

    @classmethod
    def build(cls, reference, space, found: list[FoundGraph], stats, stop_reason, key) -> SearchResult:
        unique: dict[str, FoundGraph] = {}
        for f in sorted(found, key=lambda f: f.elapsed_s):
            unique.setdefault(f.graph.content_hash(), f)
        ranked = sorted(unique.values(), key=lambda f: (f.estimated_us, f.graph.content_hash()))
        return cls(reference, space, ranked, stats, stop_reason, key)

    @property
    def graphs(self) -> list[KernelGraph]:
        return [f.graph for f in self.found]

    @property
    def best(self) -> KernelGraph | None:
        return self.found[0].graph if self.found else None

    @property
    def hashes(self) -> set[str]:
        return {f.graph.content_hash() for f in self.found}

    @property
    def checker(self) -> str:
        return self.stats.checker

    def __len__(self) -> int:
        return len(self.found)

    def __repr__(self) -> str:
        return (
            f"SearchResult({len(self.found)} verified µGraphs, stop={self.stop_reason.name}, "
            f"{self.stats.states} states in {self.stats.wall_seconds:.1f} s)"
        )

    # ---- persistence --------------------------------------------------------------------------------

    def to_document(self, budget: Budget) -> dict[str, Any]:
        return {
            "key": self.key,
            "stop_reason": self.stop_reason.value,
            "budget": budget.to_dict(),
            "space": self.space.to_dict(),
            "found": [f.to_dict() for f in self.found],
            "stats": self.stats.to_dict(),
        }

    @classmethod
    def from_document(
        cls, reference: KernelGraph, space: SearchSpace, document: dict[str, Any], key: str
    ) -> SearchResult:
        from mirage.mugraph.check import check
        from mirage.mugraph.serialize import graph_from_dict

        found = []
        for item in document["found"]:
            graph = graph_from_dict(item["graph"])
            check(graph)
            found.append(FoundGraph(graph, item["elapsed_s"], item["estimated_us"]))
        stats = SearchStatistics.from_dict(document.get("stats", {}))
        return cls(reference, space, found, stats, StopReason(document["stop_reason"]), key)

    def save(self, directory: str | Path, budget: Budget | None = None) -> Path:
        """Write ``result.json`` (the µGraphs) and ``stats.json`` beside it; returns the directory."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        (path / "result.json").write_text(json.dumps(self.to_document(budget or Budget())) + "\n")
        self.stats.save(path / "stats.json")
        return path
