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
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

FORMAT = "mirage.search-checkpoint"
RESULT_FORMAT = "mirage.search-result"
VERSION = 2  # 2: headers that fit the reference's dim classes first (unit indices changed)


def cache_dir() -> Path:
    """``$MIRAGE_CACHE_DIR`` or ``~/.cache/mirage``."""
    return Path(os.environ.get("MIRAGE_CACHE_DIR") or Path.home() / ".cache" / "mirage")


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
        if not path.exists():
            return None
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            logger.warning("ignoring unreadable checkpoint %s: %s", path, error)
            return None
        if document.get("format") != FORMAT or document.get("version") != VERSION:
            logger.warning("ignoring checkpoint %s: not a version-%d search checkpoint", path, VERSION)
            return None
        if document.get("key") != key or document.get("units_total") != units_total:
            logger.warning("ignoring checkpoint %s: it belongs to a different search", path)
            return None
        return cls(key, units_total, {int(k): v for k, v in document["done"].items()})


def checkpoint_path(key: str) -> Path:
    return cache_dir() / "checkpoints" / f"{key}.json"


class ResultCache:
    """Finished searches under ``<cache>/search/<key>/``: ``result.json`` and ``stats.json``."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or cache_dir()) / "search"

    def directory(self, key: str) -> Path:
        return self.root / key

    def load(self, key: str) -> dict[str, Any] | None:
        path = self.directory(key) / "result.json"
        if not path.exists():
            return None
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            logger.warning("ignoring unreadable cached search result %s: %s", path, error)
            return None
        if document.get("format") != RESULT_FORMAT or document.get("version") != VERSION:
            return None
        return document

    def store(self, key: str, document: dict[str, Any], stats: dict[str, Any]) -> Path:
        directory = self.directory(key)
        write_atomically(
            directory / "result.json", json.dumps({"format": RESULT_FORMAT, "version": VERSION, **document})
        )
        write_atomically(directory / "stats.json", json.dumps(stats, indent=2) + "\n")
        return directory
