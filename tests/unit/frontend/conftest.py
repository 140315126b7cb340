import pytest


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    """Every test gets its own cache directory and no progress bars."""
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MIRAGE_NO_PROGRESS", "1")
    monkeypatch.delenv("MIRAGE_NO_CACHE", raising=False)
    monkeypatch.delenv("MIRAGE_EXECUTOR", raising=False)
    return tmp_path / "cache"
