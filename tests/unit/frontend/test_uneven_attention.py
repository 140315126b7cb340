"""Attention over a token count that no block count divides (ViT's 197, here 47 for speed) through
``superoptimize``: the search's attention headers include uneven one-kernel grids
(``flash_decoding.overrides``), a µGraph of 16-row blocks whose last one overlaps is verified against
the captured subprogram and computes what float64 eager computes, on the CPU (the interpreter) and on
a GPU (its generated kernel: the online-softmax chain over padded keys, K read in place)."""

import pytest
import torch

import mirage as mi
from benchmarks.mugraphs.attention import one_kernel
from benchmarks.mugraphs.uneven import keys_in_place
from benchmarks.unseen import HeadsAttention

SHAPE = (1, 4, 47, 64)  # 47 queries and keys: 3 blocks of 16 rows, the last starting at row 31


def _uneven() -> mi.KernelGraph:
    return keys_in_place(one_kernel(4, 47, 47, 64, rows=16, key_tile=47))


def _check(device: str) -> None:
    q, k, v = (torch.randn(SHAPE, device=device).half() for _ in range(3))
    model = HeadsAttention()
    fast = mi.superoptimize(model, (q, k, v), search=False, candidates=[_uneven()], use_cache=False,
                            progress=False)
    (choice,) = fast.specializations[0].choices.values()
    assert choice.source == "candidate", fast.report()
    (block,) = [n.attrs for n in choice.graph.nodes if n.op.value == "customized"]
    assert block.grid_dim == (4, 1, 3) and block.spans == (0, 0, 47)
    with torch.no_grad():
        want = model(q.double(), k.double(), v.double())
        torch.testing.assert_close(fast(q, k, v).double(), want, rtol=2e-3, atol=2e-3)
    program = mi.codegen.generate_cuda_program(choice.graph, 90) if device == "cpu" else None
    assert program is None or "mirage::gen::OnlineSoftmax<" in program.code  # padded keys: 64 run


def test_an_uneven_attention_mugraph_serves_the_program_on_the_cpu():
    _check("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_an_uneven_attention_mugraph_serves_the_program_on_the_gpu():
    _check("cuda")


def test_the_search_offers_uneven_one_kernel_grids_for_the_program():
    from mirage.frontend import capture, partition
    from mirage.frontend.optimize import SearchSettings, with_attention_layout

    inputs = tuple(torch.randn(SHAPE) for _ in range(3))
    (sub,) = partition(capture(HeadsAttention(), inputs, {})).subprograms
    settings = with_attention_layout(sub.graph, SearchSettings(config="attention"))
    overrides = dict(settings.overrides)
    assert "grid_spans" in overrides and "[0, 0, 47]" in overrides["grid_spans"]
