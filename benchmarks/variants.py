"""Families of fused µGraphs per benchmark case: the grid and for-loop splits that profile-guided
selection chooses among (the same axes the search enumerates: grid dims and forloop ranges)."""

from __future__ import annotations

import itertools

from benchmarks.mugraphs import CASES, attention, mlp
from mirage.errors import GraphError


def _valid(make) -> list:
    out = []
    for builder in make:
        try:
            out.append(builder())
        except GraphError:
            continue
    return out


def variants(case_name: str) -> list:
    case = CASES[case_name]
    b = case.size
    match case.program:
        case "rmsnorm":
            return _valid(lambda g=g, r=r: mlp.rmsnorm_fused(b, grid=g, iters=r)
                          for g, r in itertools.product((48, 96, 192, 384), (16, 32, 64)))
        case "gatedmlp":
            return _valid(lambda g=g, r=r: mlp.gatedmlp_fused(b, grid=g, iters=r)
                          for g, r in itertools.product((64, 128, 256), (16, 32, 64)))
        case "lora":
            return _valid(lambda g=g, c=c: mlp.lora_fused(b, grid=g, concat=c)
                          for g, c in itertools.product((32, 64, 128, 256), (False, True)))
        case "gqa" | "qknorm":
            qk = case.program == "qknorm"
            return _valid(lambda s=s, q=q, r=r: attention.fused(b, qk, kv_splits=s, q_splits=q, iters=r)
                          for s, q, r in itertools.product((4, 8, 16), (4, 8, 16), (2, 4, 8)))
    return [case.fused()]
