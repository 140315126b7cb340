"""The search space record, its named configs and overrides, and the candidate generators."""

from __future__ import annotations

import pytest

from benchmarks.mugraphs import CASES
from mirage.generator import dims
from mirage.generator.candidates import after_order, input_sets, input_tuples
from mirage.generator.space import CONFIGS, OpChoice, SearchSpace, SearchSpaceError, accum, parse_op
from mirage.mugraph import TensorType, float16
from mirage.mugraph.graph import AccumKind, Reduce, RmsNorm, Scalar
from mirage.mugraph.ops import Op


def test_defaults_are_mirages():
    space = SearchSpace.named()
    assert (space.max_kernel_ops, space.max_block_ops, space.max_graph_defined, space.max_block_outputs) == (
        5,
        9,
        1,
        2,
    )
    assert (
        space.franges == (4, 16, 64) and space.fmaps == (-1, 0, 1, 2) and space.block_dims == ((128, 1, 1),)
    )
    assert len(space.imaps) == 7 and len(space.omaps) == 9
    assert accum(AccumKind.RMS) in space.block_ops and accum(AccumKind.SUM_TODIMX) not in space.block_ops


@pytest.mark.parametrize(
    "config, check",
    [
        (
            "attention",
            lambda s: (
                s.max_graph_defined == 2
                and s.attention_grids
                and len(s.imaps) == 4
                and accum(AccumKind.SUM_TODIMX) in s.block_ops
            ),
        ),
        ("lora", lambda s: OpChoice(Op.CONCAT_MATMUL) in s.block_ops and s.max_graph_defined == 1),
        ("mlp", lambda s: s == SearchSpace()),
        (None, lambda s: s == SearchSpace()),
    ],
)
def test_named_configs(config, check):
    assert check(SearchSpace.named(config))


@pytest.mark.parametrize(
    "overrides, field, expected",
    [
        ({"griddims": [[64, 1, 1]]}, "grid_dims", ((64, 1, 1),)),
        ({"griddims": [64]}, "grid_dims", ((64, 1, 1),)),
        ({"franges": [64]}, "franges", (64,)),
        ({"imaps": [(-1, -1, -1)]}, "imaps", ((-1, -1, -1),)),
        ({"max_num_threadblock_graph_op": 11}, "max_block_ops", 11),
        (
            {"block_ops": ["matmul", "accum_rms", "mul_scalar=0.5"]},
            "block_ops",
            (OpChoice(Op.MATMUL), accum(AccumKind.RMS), OpChoice(Op.MUL_SCALAR, Scalar(0.5))),
        ),
    ],
)
def test_overrides_replace_the_defaults(overrides, field, expected):
    assert getattr(SearchSpace.named("mlp", **overrides), field) == expected


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"gridims": [(1, 1, 1)]}, "unknown search-space option 'gridims'"),
        ({"block_ops": ["matmull"]}, "unknown op 'matmull'"),
        ({"block_ops": ["mul_scalar"]}, "mul_scalar needs a value"),
        ({"kernel_ops": ["accum"]}, "does not exist at the kernel level"),
        ({"franges": [0]}, "franges must be positive"),
        ({"griddims": [(1, 2)]}, "not a 3-tuple"),
    ],
)
def test_bad_overrides_say_what_is_wrong(overrides, message):
    with pytest.raises(SearchSpaceError, match=message):
        SearchSpace.named("mlp", **overrides)


def test_unknown_config():
    with pytest.raises(SearchSpaceError, match="unknown search config 'gqa'"):
        SearchSpace.named("gqa")


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_json_round_trip_and_stable_hash(config):
    space = SearchSpace.named(config, griddims=[(8, 1, 1)]).resolve(CASES["gqa_b1"].reference())
    again = SearchSpace.from_json(space.to_json())
    assert again == space and hash(again) == hash(space)
    assert again.content_hash() == space.content_hash()
    assert space.content_hash() != SearchSpace.named(config).content_hash()


def test_resolve_adds_the_references_ops_with_their_attributes():
    gqa = SearchSpace.named("attention").resolve(CASES["gqa_b1"].reference())
    assert OpChoice(Op.MUL_SCALAR, Scalar(0.125)) in gqa.kernel_ops
    assert OpChoice(Op.REDUCTION, Reduce(2)) in gqa.block_ops
    rms = SearchSpace.named("mlp").resolve(CASES["rmsnorm_b1"].reference())
    assert accum(AccumKind.RMS, 1e-6) in rms.block_ops and accum(AccumKind.RMS) not in rms.block_ops
    assert OpChoice(Op.RMS_NORM, RmsNorm(1e-6)) in rms.block_ops
    assert all(c.op is not Op.RMS_NORM for c in rms.kernel_ops)  # Mirage never explores it there
    plain = SearchSpace.named("mlp", add_reference_ops=False).resolve(CASES["gqa_b1"].reference())
    assert plain == SearchSpace.named("mlp", add_reference_ops=False)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("exp", OpChoice(Op.EXP)),
        ("accum", accum(AccumKind.NONE)),
        ("accum=sum_todimx", accum(AccumKind.SUM_TODIMX)),
        ("reduction=1", OpChoice(Op.REDUCTION, Reduce(1))),
        ("rms_norm=1e-6", OpChoice(Op.RMS_NORM, RmsNorm(1e-6))),
    ],
)
def test_parse_op(text, expected):
    assert parse_op(text) == expected
    assert OpChoice.from_json(expected.to_json()) == expected


# ---- candidate generators ---------------------------------------------------------------------------

X, W = TensorType((2, 4096), float16), TensorType((4096, 6144), float16)


def test_grid_candidates_follow_mirages_strategy():
    grids = dims.grid_candidates((X, W), SearchSpace())
    assert (64, 1, 1) in grids and (2, 1, 1) in grids  # 4096/64, and {batch, 1, 1}
    assert all(32 <= g[0] * g[1] * g[2] <= 4096 for g in grids if g != (2, 1, 1))
    assert (16, 1, 1) not in grids  # 4096/256 = 16 blocks: fewer than 32
    attention = dims.grid_candidates((X, W), SearchSpace.named("attention"))
    assert (2, 512, 1) in attention and (2, 16, 4) not in attention  # {batch,16,4} needs 3 inputs
    assert dims.grid_candidates((X, W), SearchSpace(grid_dims=((8, 2, 1),))) == [(8, 2, 1)]


@pytest.mark.parametrize(
    "grid, expected",
    [
        (
            (64, 1, 1),
            [
                ((-1, -1, -1), (1, -1, -1)),
                ((-1, -1, -1), (0, -1, -1)),
                ((1, -1, -1), (-1, -1, -1)),
                ((1, -1, -1), (1, -1, -1)),
                ((1, -1, -1), (0, -1, -1)),
            ],
        ),
        ((1, 1, 1), [((-1, -1, -1), (-1, -1, -1))]),
    ],
)
def test_imap_combinations(grid, expected):
    assert dims.imap_combinations((X, W), grid, SearchSpace()) == expected


def test_fmaps_franges_and_omaps():
    gain = TensorType((1, 4096), float16)
    assert dims.fmap_combinations((gain,), SearchSpace()) == [(-1,), (1,)]  # dim 0 has size 1
    space = SearchSpace()
    assert dims.frange_candidates((X, W), ((-1, -1, -1), (1, -1, -1)), (-1, -1), (64, 1, 1), space) == [1]
    assert dims.frange_candidates((X, W), ((-1, -1, -1), (1, -1, -1)), (1, 0), (64, 1, 1), space) == [
        4,
        16,
        64,
    ]
    assert dims.frange_candidates((X, W), ((1, -1, -1), (1, -1, -1)), (1, 0), (4096, 1, 1), space) == []
    assert dims.omap_candidates((2, 8, 16), SearchSpace()) == [(0, 2, 1)]
    assert dims.omap_candidates((1, 1, 1), SearchSpace()) == [(-1, -1, -1)]


def test_input_tuples_and_canonical_order():
    assert input_tuples(2, 2) == ((0, 0), (0, 1), (1, 0), (1, 1))  # all ordered pairs, i == j too
    assert input_tuples(3, 3) == tuple(t for t in input_tuples(3, 3) if len(set(t)) == 3)
    every = input_tuples(4, 2)
    for last in [((), -1), ((1,), 3), ((1, 2), 5), ((3, 3), 0)]:
        for rank in range(7):
            assert after_order(every, last, rank) == tuple(t for t in every if (t, rank) > last)
    assert input_sets(2) == ((0, 1), (0,), (1,))


def test_fixed_map_combinations_replace_the_products():
    q, k = TensorType((2, 256, 64), float16), TensorType((2, 64, 4096), float16)
    combos = [((0, -1, 1), (0, 2, -1)), ((0, 1, -1), (0, 1, -1)), ((0, -1, 1),)]
    space = SearchSpace.named("attention", imap_combos=combos, fmap_combos=[(-1, 2), (1, 9), (-1,)])
    assert dims.imap_combinations((q, k), (2, 8, 16), space) == [((0, -1, 1), (0, 2, -1))]
    assert dims.fmap_combinations((q, k), space) == [(-1, 2)]  # (1, 9): k has no dim 9
    assert SearchSpace.from_json(space.to_json()) == space
    assert SearchSpace.named("attention", imap_comb_to_explore=combos).imap_combos == space.imap_combos


@pytest.mark.parametrize(
    "module",
    [
        "mirage.generator.space",
        "mirage.generator.dims",
        "mirage.generator.candidates",
        "mirage.generator.expressions",
        "mirage.generator.budget",
        "mirage.generator.stats",
        "mirage.generator.cost",
        "mirage.generator",
    ],
)
def test_docstring_examples(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
