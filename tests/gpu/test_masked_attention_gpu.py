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
WARPGROUP = OptimizerOptions(warpgroup_softmax=True, tma_copies=True)
# (graph, options): the register chain on warp MMAs, on warpgroup MMAs with TMA copies, and op by op;
# the "_causal" forms' mask input names the causal pattern, which the chain computes instead of reading
FORMS = {"whole": ("whole", OptimizerOptions()), "split": ("split", OptimizerOptions()),
         "whole_warpgroup": ("whole", WARPGROUP),
         "whole_op_by_op": ("whole", OptimizerOptions(register_softmax=False)),
         "whole_causal": ("whole", OptimizerOptions()), "split_causal": ("split", OptimizerOptions()),
         "whole_warpgroup_causal": ("whole", WARPGROUP)}
CAUSAL = f"causal:{SHAPE['queries']}"


def _graph(name: str, form: str = "reference"):
    return masked_attention(**SHAPE, **({} if form == "reference" else GRAPHS[form]),
                            pattern=CAUSAL if name.endswith("_causal") else "")


SKIP_HIDDEN = "#define MIRAGE_SOFTMAX_SKIP_HIDDEN 1\n"  # sub-steps that the mask hides whole skipped


@pytest.fixture(scope="module")
def programs():
    graphs = {name: _graph(name, graph) for name, (graph, _) in FORMS.items()}
    sources = [generate_cuda_program(graphs[name], None, options=options)
               for name, (_, options) in FORMS.items()]
    sources += [dataclasses.replace(source, code=SKIP_HIDDEN + source.code) for source in sources]
    built = build_many(sources)
    return graphs, dict(zip(FORMS, built, strict=False)), dict(zip(FORMS, built[len(FORMS):], strict=True))


@pytest.mark.parametrize("form", list(FORMS))
def test_random_masks_pass_the_float_check(programs, form):
    _, built, _ = programs
    result = check_on_gpu(_graph(form), built[form].with_poison())  # a causal form: fed the causal mask
    assert result.passed, result.as_dict()


@pytest.mark.parametrize("form", [name for name in FORMS if name.endswith("_causal")])
def test_a_causal_pattern_is_computed_not_read(programs, form):
    """The chain computes the mask its input's pattern names: fed zeros, it still hides the later keys."""
    _, built, _ = programs
    kernels = built[form].cuda.prepared.kernels
    assert any(k.softmax_chain is not None and k.softmax_chain.mask_rows == SHAPE["queries"] for k in kernels)
    generator = torch.Generator(device="cuda").manual_seed(1)
    heads, queries, keys, dim = SHAPE["heads"], SHAPE["queries"], SHAPE["keys"], SHAPE["dim"]
    q, k, v = (torch.randn(s, device="cuda", generator=generator).half()
               for s in ((heads, queries, dim), (heads, dim, keys), (heads, keys, dim)))
    (got,) = built[form].with_poison()(q, k, v, torch.zeros(1, queries, keys, device="cuda").half())
    mask = torch.from_numpy(causal_mask(queries, keys)).cuda().double()
    truth = torch.softmax(q.double() @ k.double() / 8 + mask, -1) @ v.double()
    torch.testing.assert_close(got.double(), truth, rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("hidden", ["later_keys", "earlier_keys"])
def test_a_mask_that_hides_whole_tiles_gives_finite_outputs(programs, form, hidden):
    if form.endswith("_causal") and hidden == "earlier_keys":
        pytest.skip("a causal pattern's input promises the causal mask")
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


# a key-padding mask, one value a key (1, 1, keys), which every query row adds: the chain reads its one row
PER_KEY_FORMS = {"whole": ("whole", OptimizerOptions()), "split": ("split", OptimizerOptions()),
                 "whole_warpgroup": ("whole", WARPGROUP),
                 "whole_op_by_op": ("whole", OptimizerOptions(register_softmax=False))}


@pytest.fixture(scope="module")
def per_key_programs():
    graphs = {name: masked_attention(**SHAPE, **GRAPHS[form], per_key=True)
              for name, (form, _) in PER_KEY_FORMS.items()}
    built = build_many([generate_cuda_program(graphs[name], None, options=options)
                        for name, (_, options) in PER_KEY_FORMS.items()])
    return graphs, dict(zip(PER_KEY_FORMS, built, strict=True))


@pytest.mark.parametrize("form", list(PER_KEY_FORMS))
def test_key_padding_masks_pass_the_float_check_and_hide_the_padded_keys(per_key_programs, form):
    graphs, built = per_key_programs
    result = check_on_gpu(masked_attention(**SHAPE, per_key=True), built[form].with_poison())
    assert result.passed, result.as_dict()
    if form != "whole_op_by_op":
        assert any(k.softmax_chain is not None for k in built[form].cuda.prepared.kernels)
    generator = torch.Generator(device="cuda").manual_seed(2)
    heads, queries, keys, dim = SHAPE["heads"], SHAPE["queries"], SHAPE["keys"], SHAPE["dim"]
    q, k, v = (torch.randn(s, device="cuda", generator=generator).half()
               for s in ((heads, queries, dim), (heads, dim, keys), (heads, keys, dim)))
    mask = torch.zeros(1, 1, keys, device="cuda")
    mask[..., 131:] = float("-inf")  # a prompt of 131 tokens padded to 256
    (got,) = built[form].with_poison()(q, k, v, mask.half())
    truth = torch.softmax(q.double() @ k.double() / 8 + mask.double(), -1) @ v.double()
    torch.testing.assert_close(got.double(), truth, rtol=2e-2, atol=2e-3)
