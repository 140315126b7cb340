"""The command line with arguments outside the other tests: an output that is a folder fails before the
search (not after it, losing the result), and a factory or module that raises is a one-line error that
says where, with exit status 2."""

from __future__ import annotations

import importlib
import logging

import pytest

from mirage.cli import main
from mirage.frontend import optimize


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MIRAGE_NO_PROGRESS", "1")
    monkeypatch.chdir(tmp_path)




@pytest.fixture
def no_search(monkeypatch):
    def run_search(reference, settings, progress=True):
        raise AssertionError("the search ran before the arguments were checked")

    monkeypatch.setattr(optimize, "run_search", run_search)


@pytest.fixture
def factories(tmp_path):
    (tmp_path / "models.py").write_text(
        "import torch\n"
        "def raises():\n"
        "    raise RuntimeError('no weights here')\n"
        "def make():\n"
        "    return (lambda x: x * 2), (torch.randn(4, 4),)\n")
    (tmp_path / "broken.py").write_text("import torch\nraise ValueError('bad module')\n")
    (tmp_path / "syntax.py").write_text("def f(:\n")
    return tmp_path


def _error(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines  # one line, no traceback
    return lines[0]


@pytest.mark.parametrize("command", ["search", "draw"])
def test_an_output_that_is_a_folder_fails_before_any_work(command, graph_file, tmp_path, no_search, capsys):
    (tmp_path / "out.json").mkdir()
    argv = [command, str(graph_file), "-o", str(tmp_path / "out.json")]
    assert main(argv + (["--time-limit", "1"] if command == "search" else [])) == 2
    assert "it is a folder" in _error(capsys)


def test_a_partition_drawing_to_a_missing_folder_fails_before_capture(factories, capsys, monkeypatch):
    capture = importlib.import_module("mirage.frontend.capture")
    monkeypatch.setattr(capture, "capture", lambda *a, **k: pytest.fail("captured before the check"))
    assert main(["partition", "models.py:make", "-o", "nowhere/p.dot"]) == 2
    assert "does not exist" in _error(capsys)


@pytest.mark.parametrize(("spec", "words"), [
    ("models.py:raises", ["models.py:raises failed: RuntimeError: no weights here", "models.py:3"]),
    ("broken.py:f", ["cannot import broken.py: ValueError: bad module", "broken.py:2"]),
    ("syntax.py:f", ["cannot import syntax.py: SyntaxError", "syntax.py:1"]),
], ids=["factory raises", "module raises", "syntax error"])
@pytest.mark.parametrize("command", ["partition", "search"])
def test_user_code_that_raises_is_a_one_line_error(command, spec, words, factories, no_search, capsys):
    assert main([command, spec]) == 2
    line = _error(capsys)
    assert line.startswith(f"mirage {command}: error:")
    for word in words:
        assert word in line
    assert "mirage -v" in line


def test_verbose_shows_the_traceback_of_user_code(factories, capsys):
    logging.getLogger("mirage").handlers.clear()
    assert main(["-v", "partition", "models.py:raises"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "raise RuntimeError('no weights here')" in err


def test_demo_output_dir_that_is_a_file(tmp_path, capsys):
    (tmp_path / "taken").write_text("")
    assert main(["demo", "--no-search", "--output-dir", str(tmp_path / "taken")]) == 2
    assert "is a file" in _error(capsys)
