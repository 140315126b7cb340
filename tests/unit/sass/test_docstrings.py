from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize("module", ["mirage.sass.control", "mirage.sass.instruction", "mirage.sass.launch"])
def test_docstring_examples(module):
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0
