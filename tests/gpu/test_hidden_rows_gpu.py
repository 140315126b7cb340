"""A query row whose mask hides every key, through the generated attention kernel on a GPU: PyTorch's
``scaled_dot_product_attention`` gives it 0, the kernel's ``softmax(scores + mask)`` alone 0 / 0; the
step that capture adds after the attention (``mirage.frontend.hidden_rows``) makes the program give 0
too, on the first call, on the second (which checks the mask once) and after it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

import torch.nn.functional as F  # noqa: E402

import mirage as mi  # noqa: E402

pytestmark = pytest.mark.gpu


def attention(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_a_row_hidden_whole_is_zero_through_our_kernel(kind):
    generator = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 4, 128, 64, device="cuda", generator=generator).half() for _ in range(3))
    keep = torch.rand(128, 128, device="cuda", generator=generator) > 0.3
    keep[5] = False  # query 5 sees no key
    additive = torch.zeros(128, 128, device="cuda").half().masked_fill(~keep, float("-inf"))
    mask = keep if kind == "bool" else additive
    fast = mi.superoptimize(attention, (q, k, v, mask), time_limit_s=60, max_results=4, use_cache=False,
                            progress=False, whole_program_check=False)
    report = fast.report()
    assert "µGraph from search" in report, report  # the attention runs as our kernel, not PyTorch's
    want = attention(q.double(), k.double(), v.double(), mask if kind == "bool" else mask.double())
    for _ in range(3):  # the first call, the check on the second, the checked mask after
        got = fast(q, k, v, mask)
        assert not got.isnan().any()
        assert torch.equal(got[0, :, 5], torch.zeros_like(got[0, :, 5]))
        torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-3)
