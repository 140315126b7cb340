"""``benchmarks.attention_isolate``: every cut finds its statements in the generated attention kernels
(a cut that matched nothing would time the kernel as built under another name), and each cut gets
the probe defines its name asks for."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks import attention_isolate as isolate
from benchmarks.gemv_isolate import cut
from mirage.codegen.lower_program import generate_cuda_program
from mirage.optimizer import OptimizerOptions


@pytest.mark.parametrize(("case", "parts", "stages"), isolate.MEMBERS)
def test_every_cut_applies_to_every_member(case, parts, stages):
    graph = isolate.member(case, parts)
    options = dataclasses.replace(OptimizerOptions(), stages=stages, warpgroup_softmax=True, tma_copies=True)
    code = generate_cuda_program(graph, 90, options=options).code
    for name, patterns in isolate.CUTS.items():
        changed = cut(code, patterns)
        assert (changed == code) == (not patterns), name
    assert "::step(" in code and "::step(" not in cut(code, isolate.CUTS["no_step"])


def test_probe_defines_follow_the_cut_names():
    assert isolate.probes("as_generated") == "" and isolate.probes("no_copies") == ""
    assert isolate.probes("no_exp2_no_copies") == "#define MIRAGE_PROBE_NO_EXP2 1\n"
    assert isolate.probes("sub128") == "#define MIRAGE_WARPGROUP_SUB_KEYS 128\n"
    assert isolate.probes("no_lookahead") == "#define MIRAGE_SOFTMAX_LOOKAHEAD 0\n"
    assert isolate.probes("ieee") == "#define MIRAGE_PROBE_IEEE_DIV_SQRT 1\n"
    both = isolate.probes("no_mma_no_exp2_no_copies")
    assert "MIRAGE_PROBE_CHAIN 3" in both and "MIRAGE_PROBE_NO_EXP2 1" in both


def test_members_come_from_the_wide_family_where_the_suite_has_none():
    wide = ("kv_splits=4,q_splits=2,iters=4,threads=256,", "combine_rows=8")  # 256 keys an iteration
    assert isolate.member("gqa_b8", wide).name  # not in the suite's family
    with pytest.raises(LookupError, match="no member"):
        isolate.member("gqa_b8", ("kv_splits=3,",))
