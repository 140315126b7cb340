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
