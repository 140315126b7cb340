"""Attention with an additive mask on a GPU: the one-kernel and the two-kernel µGraph, fed causal
attention's mask of 0 and −inf (and its mirror image, which hides the loop's first iterations from
the later rows), with the register chain on warp or warpgroup MMAs (which adds the mask to its
products, and may skip the sub-steps it hides whole: bit for bit as running them) and op by op. The
running maxima start from a finite floor (``running_max_floor``), so the blocks and splits that see
no key of a row give exp(s − m) = 0 and a rescale of 1 instead of NaN; the outputs match float64
PyTorch. With random masks, each build passes the float check too."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

from mirage.codegen.gpu_check import check_on_gpu  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.runtime import build_many  # noqa: E402
from mirage.optimizer import OptimizerOptions  # noqa: E402
from tests.unit.verifier.verifier_graphs import causal_mask, masked_attention  # noqa: E402

pytestmark = pytest.mark.gpu

SHAPE = dict(heads=4, queries=128, keys=256, dim=64)
GRAPHS = {"whole": dict(form="whole", rows=64, key_tile=64),
          "split": dict(form="split", rows=16, kv_splits=4)}
# (graph, options): the register chain on warp MMAs, on warpgroup MMAs with TMA copies, and op by op
FORMS = {"whole": ("whole", OptimizerOptions()), "split": ("split", OptimizerOptions()),
         "whole_warpgroup": ("whole", OptimizerOptions(warpgroup_softmax=True, tma_copies=True)),
         "whole_op_by_op": ("whole", OptimizerOptions(register_softmax=False))}


SKIP_HIDDEN = "#define MIRAGE_SOFTMAX_SKIP_HIDDEN 1\n"  # sub-steps that the mask hides whole skipped


@pytest.fixture(scope="module")
def programs():
    graphs = {name: masked_attention(**SHAPE, **GRAPHS[graph]) for name, (graph, _) in FORMS.items()}
    sources = [generate_cuda_program(graphs[name], None, options=options)
               for name, (_, options) in FORMS.items()]
    sources += [dataclasses.replace(source, code=SKIP_HIDDEN + source.code) for source in sources]
    built = build_many(sources)
    return graphs, dict(zip(FORMS, built, strict=False)), dict(zip(FORMS, built[len(FORMS):], strict=True))


@pytest.mark.parametrize("form", list(FORMS))
def test_random_masks_pass_the_float_check(programs, form):
    _, built, _ = programs
    result = check_on_gpu(masked_attention(**SHAPE), built[form].with_poison())
    assert result.passed, result.as_dict()


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("hidden", ["later_keys", "earlier_keys"])
def test_a_mask_that_hides_whole_tiles_gives_finite_outputs(programs, form, hidden):
    _, built, skipping = programs
    generator = torch.Generator(device="cuda").manual_seed(0)
    heads, queries, keys, dim = SHAPE["heads"], SHAPE["queries"], SHAPE["keys"], SHAPE["dim"]
    q, k, v = (torch.randn(s, device="cuda", generator=generator).half()
               for s in ((heads, queries, dim), (heads, dim, keys), (heads, keys, dim)))
    mask = torch.from_numpy(causal_mask(queries, keys)).cuda()
    if hidden == "earlier_keys":
        mask = mask.flip(1, 2).contiguous()
    (got,) = built[form].with_poison()(q, k, v, mask.half())
    scores = q.double() @ k.double() / 8 + mask.double()
    truth = torch.softmax(scores, -1) @ v.double()
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), truth, rtol=2e-2, atol=2e-3)
    # with the sub-steps that the mask hides whole skipped: the same bits as running them
    (skipped,) = skipping[form].with_poison()(q, k, v, mask.half())
    assert torch.equal(got, skipped)
