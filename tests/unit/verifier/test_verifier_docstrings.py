"""The verifier's docstring examples run as written."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize("module", [
    "mirage.verifier.field", "mirage.verifier.classify", "mirage.verifier.verify",
    "mirage.verifier.floating_point", "mirage.verifier.mutate",
])
def test_docstring_examples(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
