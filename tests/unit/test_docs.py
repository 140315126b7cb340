"""The README's example and the docstring examples run as written."""

from __future__ import annotations

import doctest
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_readme_builder_example_runs():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "the README has no python example"
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})


@pytest.mark.parametrize("module", [
    "mirage.mugraph.builder", "mirage.mugraph.interpret", "mirage.mugraph.algebra",
    "mirage.codegen.lower_program", "mirage.codegen.random_graphs",
])
def test_docstring_examples(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def _gpu_param():
    import torch

    return pytest.param(True, id="gpu", marks=[
        pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")])


@pytest.mark.parametrize("on_gpu", [pytest.param(False, id="cpu"), _gpu_param()])
@pytest.mark.parametrize("page", ["codegen-lowering", "codegen", "optimizer", "verifier", "search",
                                  "user-guide"])
def test_the_pages_examples_run(page, on_gpu, monkeypatch, tmp_path):
    """Each page's examples run as written, in order and in one namespace (the blocks marked as
    needing a GPU in the run marked ``gpu``); the search page's 600 s budget is cut to 3 s."""
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(tmp_path))  # a search that runs, not one answered from a cache
    monkeypatch.setenv("MIRAGE_NO_PROGRESS", "1")
    monkeypatch.chdir(tmp_path)  # what the examples write (a drawn partition, generated CUDA) goes there
    if page == "user-guide" and on_gpu:
        pytest.skip("the guide's GPU blocks search for minutes (120 s budgets): its CPU blocks run here")
    text = (ROOT / "docs" / f"{page}.md").read_text()
    if page == "search":
        assert "Budget(time_s=600)" in text
        text = text.replace("Budget(time_s=600)", "Budget(time_s=3)")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    namespace: dict = {"__name__": "__main__"}
    for block in blocks:
        if block.startswith("# needs a GPU") and not on_gpu:
            continue
        exec(compile(block, f"docs/{page}.md", "exec"), namespace)
