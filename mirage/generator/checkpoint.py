"""Checkpoints of a running search, and the on-disk cache of finished searches.

Both are keyed by :func:`search_key`: the reference graph's content hash, the search space's hash,
the library version and the options that change the result (seed, checker, switched-off rules).

* A checkpoint (``<cache>/checkpoints/<key>.json``, or a path the user gives) lists the work units
  already finished, with their verified µGraphs and statistics.  It is written atomically every few
  seconds; a search started with the same key resumes from it and skips those units, so it ends
  with the same result set as an uninterrupted run.
* The result cache (``<cache>/search/<key>/result.json`` and ``stats.json`` beside it) holds the
  result of a finished search; the same search with a budget it covers is answered from it.

The cache directory is ``$MIRAGE_CACHE_DIR``, by default ``~/.cache/mirage``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mirage.config import warn_corrupt, warn_unwritable

logger = logging.getLogger(__name__)

FORMAT = "mirage.search-checkpoint"
RESULT_FORMAT = "mirage.search-result"
VERSION = 2  # 2: headers that fit the reference's dim classes first (unit indices changed)


def cache_dir() -> Path:
    """The cache folder of :func:`mirage.config.cache_dir` (``$MIRAGE_CACHE_DIR`` with ``~`` expanded,
    else ``$XDG_CACHE_HOME/mirage`` or ``~/.cache/mirage``): the folder ``mirage cache`` lists and clears."""
    from mirage import config

    return config.cache_dir()


def library_version() -> str:
    import mirage

    return getattr(mirage, "__version__", "0")


def search_key(graph_hash: str, space_hash: str, options: dict[str, Any]) -> str:
    """The key of a search: (graph hash, search-space hash, library version, result-changing options)."""
    text = json.dumps(
        {"graph": graph_hash, "space": space_hash, "version": library_version(), "options": options},
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


@dataclass
class Checkpoint:
    key: str
    units_total: int
    done: dict[int, dict[str, Any]] = field(default_factory=dict)  # unit index -> unit record

    def save(self, path: Path) -> None:
        document = {
            "format": FORMAT,
            "version": VERSION,
            "key": self.key,
            "units_total": self.units_total,
            "done": {str(k): v for k, v in sorted(self.done.items())},
        }
        write_atomically(path, json.dumps(document, separators=(",", ":")))

    @classmethod
    def load(cls, path: Path, key: str, units_total: int) -> Checkpoint | None:
        """The checkpoint at ``path`` if it belongs to this search, else ``None`` (with a warning)."""
        document = _read_object(path)
        if document is None:
            return None
        if document.get("format") != FORMAT or document.get("version") != VERSION:
            logger.warning("ignoring checkpoint %s: not a version-%d search checkpoint", path, VERSION)
            return None
        if document.get("key") != key or document.get("units_total") != units_total:
            logger.warning("ignoring checkpoint %s: it belongs to a different search", path)
            return None
        try:
            done = _checked_units(document.get("done"), units_total)
        except (ValueError, TypeError, KeyError) as error:
            warn_corrupt(path, error)
            return None
        return cls(key, units_total, done)


def _read_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; ``None`` if there is no such file, or (with a warning) if it is
    unreadable or holds something other than an object."""
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        warn_corrupt(path, error)
        return None
    if not isinstance(document, dict):
        warn_corrupt(path, f"a JSON {type(document).__name__}, not an object")
        return None
    return document


def _checked_units(done: Any, units_total: int) -> dict[int, dict[str, Any]]:
    """The finished work units of a checkpoint document, checked (ValueError/TypeError/KeyError if not)."""
    from mirage.generator.budget import StopReason
    from mirage.mugraph.serialize import loads

    if not isinstance(done, dict):
        raise ValueError(f"'done' is a {type(done).__name__}, not an object")
    units: dict[int, dict[str, Any]] = {}
    for name, record in done.items():
        index = int(name)
        if not 0 <= index < units_total:
            raise ValueError(f"unit {index} out of range")
        if not isinstance(record, dict) or record.get("index") != index:
            raise ValueError(f"unit {name}: not a unit record")
        if record.get("stop") is not None:
            StopReason(record["stop"])
            # only units that ran to their end are kept: a stop here would end the resumed search
            raise ValueError(f"unit {name}: stopped early ({record['stop']!r}), so not a finished unit")
        if not _count(record.get("states")) or not isinstance(record.get("stats"), dict):
            raise ValueError(f"unit {name}: no state count or statistics")
        _check_unit_stats(name, record["stats"])
        if not isinstance(record.get("found"), list):
            raise ValueError(f"unit {name}: 'found' is not a list")
        for found in record["found"]:
            if not isinstance(found, dict):
                raise ValueError(f"unit {name}: a found µGraph is not an object")
            if not _count(found["position"]) or not _seconds(found["elapsed_s"]):
                raise ValueError(f"unit {name}: a found µGraph's position {found['position']!r} or time "
                                 f"{found['elapsed_s']!r} is not a count and a number of seconds")
            if not isinstance(found["graph"], str):
                raise ValueError(f"unit {name}: a found µGraph is not a serialized graph")
            try:
                loads(found["graph"])
            except Exception as error:  # noqa: BLE001 - any failure to read it makes the file unusable
                raise ValueError(f"unit {name}: unreadable µGraph ({error})") from None
        units[index] = record
    return units


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _seconds(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and value >= 0)


_UNIT_COUNTS = ("kernel_states", "block_states", "block_states_searched", "verify_calls")
_UNIT_TABLES = ("states_per_depth", "pruned")


def _check_unit_stats(name: str, stats: dict[str, Any]) -> None:
    """ValueError unless a unit's statistics hold what ``SearchStatistics.add_unit`` adds up."""
    for key in _UNIT_COUNTS:
        if key in stats and not _count(stats[key]):
            raise ValueError(f"unit {name}: statistic {key!r} is {stats[key]!r}, not a count")
    for key in ("verify_s", "seconds"):
        if key in stats and not _seconds(stats[key]):
            raise ValueError(f"unit {name}: statistic {key!r} is {stats[key]!r}, not a number of seconds")
    for key in _UNIT_TABLES:
        table = stats.get(key, {})
        if not isinstance(table, dict) or not all(isinstance(k, str) and _count(v) for k, v in table.items()):
            raise ValueError(f"unit {name}: statistic {key!r} is not a table of counts")


def checkpoint_path(key: str, results: str | os.PathLike | None = None) -> Path:
    """Where search ``key``'s checkpoint lives: beside the configured cache's finished searches, or in
    the ``checkpoints`` folder of ``results`` (a search's own folder of finished searches)."""
    root = cache_dir() if results is None else Path(results).expanduser()
    return root / "checkpoints" / f"{key}.json"


class ResultCache:
    """Finished searches under ``<cache>/search/<key>/``: ``result.json`` and ``stats.json``."""

    def __init__(self, root: Path | None = None, directory: str | os.PathLike | None = None) -> None:
        """Under ``<root>/search`` (default root: the configured cache), or in ``directory`` itself."""
        self.root = (Path(directory).expanduser() if directory is not None
                     else (root or cache_dir()) / "search")

    def directory(self, key: str) -> Path:
        return self.root / key

    def load(self, key: str) -> dict[str, Any] | None:
        """The cached result of search ``key``, checked; ``None`` (with one warning) if it is malformed."""
        path = self.directory(key) / "result.json"
        document = _read_object(path)
        if document is None:
            return None
        if document.get("format") != RESULT_FORMAT or document.get("version") != VERSION:
            return None
        problem = _result_problem(document)
        if problem:
            warn_corrupt(path, problem)
            return None
        return document

    def store(self, key: str, document: dict[str, Any], stats: dict[str, Any]) -> Path | None:
        """Write the result; a failed write (read-only cache folder) warns once and returns ``None``."""
        directory = self.directory(key)
        try:
            text = json.dumps({"format": RESULT_FORMAT, "version": VERSION, **document})
            write_atomically(directory / "result.json", text)
            write_atomically(directory / "stats.json", json.dumps(stats, indent=2) + "\n")
        except OSError as error:
            warn_unwritable(directory / "result.json", error)
            return None
        return directory


def _result_problem(document: dict[str, Any]) -> str:
    """What is wrong with a cached result document ('' if nothing the loader would trip over)."""
    from mirage.generator.budget import StopReason

    try:
        StopReason(document.get("stop_reason"))
    except ValueError:
        return f"unknown stop reason {document.get('stop_reason')!r}"
    for name in ("budget", "stats", "space"):
        if name in document and not isinstance(document[name], dict):
            return f"{name!r} is not an object"
    from mirage.generator.budget import Budget
    from mirage.generator.space import SearchSpaceError

    try:
        Budget.from_dict(document.get("budget", {}))
    except SearchSpaceError as error:
        return f"its budget is unusable ({error})"
    found = document.get("found")
    if not isinstance(found, list):
        return "'found' is not a list"
    for item in found:
        if not isinstance(item, dict) or not isinstance(item.get("graph"), dict):
            return "a found µGraph is not an object with a graph"
        if not all(isinstance(item.get(k), (int, float)) for k in ("elapsed_s", "estimated_us")):
            return "a found µGraph has no times"
    return ""
