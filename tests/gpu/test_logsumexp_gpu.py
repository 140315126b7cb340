"""log_softmax and logsumexp on a GPU: block graphs whose log adds back the row maximum (in one step
and over a for-loop's running maximum), and PyTorch programs through ``mirage.superoptimize``, with
logits past exp's float32 range, against float64."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

import mirage as mi  # noqa: E402
from mirage.codegen.gpu_check import check_on_gpu  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.runtime import build_many  # noqa: E402
from tests.unit.optimizer.optimizer_graphs import logsumexp_block  # noqa: E402

pytestmark = pytest.mark.gpu

FORMS = {"log_softmax": (1, True), "logsumexp": (1, False), "logsumexp_four_steps": (4, False)}


@pytest.fixture(scope="module")
def built() -> dict:
    graphs = {(name, dtype): logsumexp_block(*form, rows=64, cols=1024, dtype=dtype)
              for name, form in FORMS.items() for dtype in (mi.float16, mi.float32)}
    programs = build_many([generate_cuda_program(g) for g in graphs.values()])
    return {key: (graphs[key], program) for key, program in zip(graphs, programs, strict=True)}


@pytest.mark.parametrize("dtype", [mi.float16, mi.float32], ids=["float16", "float32"])
@pytest.mark.parametrize("name", FORMS)
def test_block_forms_match_float64_past_exps_range(built, name, dtype):
    graph, program = built[(name, dtype)]
    assert not isinstance(program, Exception), program
    x = torch.randn(64, 1024, device="cuda") * 40  # rows reach ±150: exp overflows float32
    x[1] -= 200.0
    x = x.to(torch.float16 if dtype is mi.float16 else torch.float32)
    result = check_on_gpu(graph, program.with_poison(), inputs=[x])
    assert result.passed, result.as_dict()
    (got,) = program(x)
    assert torch.isfinite(got).all()


def _logits_program(x, w):
    return torch.log_softmax(x @ w, -1)


def _logsumexp_program(x):
    return torch.logsumexp(x * 2.0, -1)


@pytest.mark.parametrize("program, shapes", [(_logits_program, [(32, 256), (256, 1024)]),
                                             (_logsumexp_program, [(64, 2048)])],
                         ids=["log_softmax_of_a_product", "logsumexp"])
def test_programs_through_superoptimize(program, shapes):
    torch.manual_seed(4)
    args = [torch.randn(*s, device="cuda", dtype=torch.float16) for s in shapes]
    if len(args) == 2:
        args[1] = args[1] / 2  # logits of about ±100: past exp's float32 range
    else:
        args[0] = args[0] * 30
    fast = mi.superoptimize(program, tuple(args), time_limit_s=120, max_results=4, use_cache=False,
                            progress=False)
    assert not fast.partition.pytorch_ops
    got = fast(*args).double()
    want = program(*[a.double() for a in args])
    assert torch.isfinite(got).all()
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-3 * scale)
