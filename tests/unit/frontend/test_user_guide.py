"""The user guide's examples run as written (GPU blocks only where CUDA is), and the frontend's
docstring examples pass."""

import doctest
import importlib
import logging
import re
from pathlib import Path

import pytest
import torch

from mirage.frontend import optimize

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "user-guide.md"


ON_GPU = pytest.param(True, id="gpu", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")])


@pytest.mark.parametrize("on_gpu", [pytest.param(False, id="cpu"), ON_GPU])
def test_user_guide_examples_run(on_gpu, monkeypatch, tmp_path, caplog):
    searches = []

    def quick_search(reference, settings, progress=True):  # the guide is about the API, not the search
        searches.append(settings.time_limit_s)
        return None, "0 verified µGraph(s); search stopped: test", [], False

    monkeypatch.setattr(optimize, "run_search", quick_search)
    monkeypatch.chdir(tmp_path)
    torch._dynamo.reset()
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert len(blocks) >= 5
    namespace: dict = {"__name__": "__main__"}  # as a script runs them
    with caplog.at_level(logging.WARNING, logger="mirage.frontend"):
        for block in blocks:
            if block.startswith("# needs a GPU") and not on_gpu:
                continue
            exec(compile(block, str(GUIDE), "exec"), namespace)
    assert 10 in searches  # the guide's time_limit_s reached the search
    assert (tmp_path / "partition.dot").read_text().startswith("digraph")
    notice = "mirage: aten.cumsum.default (cumsum) runs in PyTorch: no µGraph lowering"
    assert notice in GUIDE.read_text()
    messages = [r.getMessage() for r in caplog.records]
    assert notice in messages
    (upcast,) = re.findall(r"# (mirage: aten\.to\.dtype .*)", GUIDE.read_text())
    assert upcast in messages


@pytest.mark.parametrize("module", ["mirage.api", "mirage.frontend.shapes", "mirage.frontend.lowering",
                                    "mirage.frontend.runtime", "mirage.frontend.options",
                                    "mirage.frontend.state", "mirage.frontend.guard",
                                    "mirage.frontend.graphs"])
def test_docstring_examples(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
