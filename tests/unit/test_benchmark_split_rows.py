"""The split-row probe (``benchmarks.split_rows``): the builds it times and its ``--off`` variants."""

from __future__ import annotations

import pytest

from benchmarks import split_rows


def test_builds_take_the_frontends_split_counts_beside_the_fixed_ones():
    """GPT-2's 50,257 columns divide by none of 8, 16 and 32: its builds are the frontend's 29 slices
    (log_softmax and logsumexp, three thread counts each); one block a row does not fit."""
    built = split_rows.builds([(8, 50257)])
    splits = {row["splits"] for row, graph in built if row["form"] == "split" and not isinstance(graph, str)}
    assert splits == {29}
    assert sum(row["form"] == "split" for row, _ in built) == 2 * len(split_rows.THREADS)
    llama = split_rows.builds([(8, 32000)])
    assert {row["splits"] for row, _ in llama if row["form"] == "split"} == {8, 16, 32}


def test_off_names_option_fields_and_refuses_others(capsys):
    with pytest.raises(SystemExit):
        split_rows.main(["--shapes", "8x32000", "--off", "ragged_rows,no_such_option"])
    assert "--off no_such_option: no such OptimizerOptions field" in capsys.readouterr().err
