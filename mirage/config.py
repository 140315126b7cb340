"""Configuration from environment variables, read in this one module.

Every setting is read when it is asked for (not at import), so a test or a long-running process can
change the environment and see the change.  The variables:

===============================  ==================================================================
``MIRAGE_CACHE_DIR``             where search results and compiled kernels are cached
                                 (default ``$XDG_CACHE_HOME/mirage``, else ``~/.cache/mirage``)
``MIRAGE_NO_CACHE``              ``1`` to neither read nor write the on-disk caches
``MIRAGE_EXECUTOR``              ``auto`` (default), ``interpret`` or ``cuda``: how subprograms run
``MIRAGE_NO_PROGRESS``           ``1`` to hide progress bars
``MIRAGE_LOG_LEVEL``             level of the ``mirage`` logger set by the command line (default INFO)
``MIRAGE_COMPILE_TIME_LIMIT``    seconds one compiler run may take before it is stopped and its
                                 build fails (default 150)
===============================  ==================================================================
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from mirage.errors import MirageError

EXECUTORS = ("auto", "interpret", "cuda")


class ConfigError(MirageError):
    """An environment variable has a value mirage cannot use."""


def _flag(name: str) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"{name}={os.environ[name]!r} is not a yes/no value; use 1 or 0")


@dataclass(frozen=True)
class Settings:
    cache_dir: Path
    use_cache: bool
    executor: str
    progress: bool
    log_level: str

    @property
    def search_cache_dir(self) -> Path:
        return self.cache_dir / "search"


def cache_dir() -> Path:
    explicit = os.environ.get("MIRAGE_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "mirage"


def settings() -> Settings:
    """The current settings (read from the environment now)."""
    executor = os.environ.get("MIRAGE_EXECUTOR", "auto").strip().lower() or "auto"
    if executor not in EXECUTORS:
        raise ConfigError(f"MIRAGE_EXECUTOR={executor!r}; use one of {', '.join(EXECUTORS)}")
    return Settings(
        cache_dir=cache_dir(),
        use_cache=not _flag("MIRAGE_NO_CACHE"),
        executor=executor,
        progress=not _flag("MIRAGE_NO_PROGRESS"),
        log_level=os.environ.get("MIRAGE_LOG_LEVEL", "INFO").upper(),
    )


def compile_time_limit_s() -> float:
    """How long one compiler or tool run may take (``MIRAGE_COMPILE_TIME_LIMIT``, seconds; default 150):
    a kernel whose tiles make the compiler unroll without end fails as a build instead of stalling the
    selection that builds it beside others."""
    value = os.environ.get("MIRAGE_COMPILE_TIME_LIMIT", "150")
    try:
        limit = float(value)
    except ValueError:
        raise ConfigError(f"MIRAGE_COMPILE_TIME_LIMIT={value!r} is not a number of seconds") from None
    if not limit > 0:
        raise ConfigError(f"MIRAGE_COMPILE_TIME_LIMIT={value!r} must be a positive number of seconds")
    return limit


# ---- the caches' two warnings (search entries, result caches, checkpoints, compiled kernels) --------

_cache_logger = logging.getLogger("mirage.cache")


def warn_corrupt(path: Path, reason: object) -> None:
    """One warning for a cache or checkpoint file that cannot be used: it is ignored (and rewritten)."""
    _cache_logger.warning("mirage: corrupt cache file %s ignored: %s; it will be rewritten", path, reason)


def warn_unwritable(path: Path, error: BaseException) -> None:
    """One warning for a cache or checkpoint write that failed: the work goes on without it."""
    _cache_logger.warning("mirage: could not write the cache file %s (%s: %s); the result is still used, "
                          "but not kept: make the cache folder writable ($MIRAGE_CACHE_DIR, cache_dir=), or "
                          "switch the cache off (use_cache=False, MIRAGE_NO_CACHE=1)",
                          path, type(error).__name__, error)
