"""The how-to of docs/pruning.md runs as written: the example rule cuts, and its counters show."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mirage.generator.pruning import RULES

DOC = Path(__file__).resolve().parents[3] / "docs" / "pruning.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


@pytest.fixture
def clean_registry():
    before = dict(RULES)
    yield
    RULES.clear()
    RULES.update(before)


def test_the_worked_example_registers_a_rule_and_counts_its_cuts(clean_registry):
    blocks = _python_blocks()
    assert len(blocks) == 3
    namespace: dict = {}
    for block in blocks[:2]:
        exec(compile(block, str(DOC), "exec"), namespace)
    stats = namespace["table"].stats
    assert stats.rules["square_not_self_mul"].checked == 2
    assert stats.rules["square_not_self_mul"].cut == 1
    assert stats.rules["abstract_expression"].cut == 1
    assert (stats.candidates, stats.kept) == (3, 1)


@pytest.mark.slow
def test_the_worked_example_rule_shows_in_the_search_statistics(clean_registry):
    pytest.importorskip("mirage.generator.driver", reason="the search driver is not in this tree")
    namespace: dict = {}
    for block in _python_blocks():
        exec(compile(block, str(DOC), "exec"), namespace)
    assert namespace["result"].stats.pruned["square_not_self_mul"] > 0
