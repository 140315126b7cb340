"""Input patterns (mirage.mugraph.patterns): the values a pattern names, checked against float64
PyTorch's causal attention mask; their errors; their place in a graph's file and content hash; and the
random inputs of checks on the GPU, which take a pattern's values."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import mirage as mi  # noqa: E402
from mirage.codegen.gpu_check import random_inputs  # noqa: E402
from mirage.errors import GraphError  # noqa: E402
from mirage.mugraph import patterns  # noqa: E402
from mirage.mugraph.serialize import content_hash, dumps, loads  # noqa: E402


def _sdpa_mask(queries: int, keys: int) -> torch.Tensor:
    """What SDPA's ``is_causal=True`` adds to the scores, read back from SDPA itself: with V the
    identity, each output row is the softmax of that row's masked scores (all 0 before the mask)."""
    q = torch.zeros(1, 1, queries, 4, dtype=torch.float64)
    k = torch.zeros(1, 1, keys, 4, dtype=torch.float64)
    v = torch.eye(keys, dtype=torch.float64)[None, None]
    weights = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)[0, 0]
    return torch.where(weights > 0, 0.0, float("-inf"))


@pytest.mark.parametrize("queries, keys", [(5, 5), (4, 7), (7, 4)])
def test_causal_values_are_sdpa_masks(queries, keys):
    got = patterns.values(patterns.causal(queries), (queries, keys), torch.float64)
    expected = _sdpa_mask(queries, keys)
    rows = min(queries, keys)  # SDPA leaves rows that see no key NaN-free only where some key is seen
    assert torch.equal(got[:rows], expected[:rows])
    assert patterns.matches(patterns.causal(queries), got)
    assert not patterns.matches(patterns.causal(queries), torch.zeros(queries, keys, dtype=torch.float64))


def test_folded_rows_repeat_the_queries():
    """Grouped-query heads folded into the rows: row r is query r mod L."""
    got = patterns.values("causal:3", (1, 6, 4), torch.float32)
    single = patterns.values("causal:3", (3, 4), torch.float32)
    assert got.shape == (1, 6, 4) and torch.equal(got[0], single.repeat(2, 1))


@pytest.mark.parametrize("pattern, shape, message", [
    ("triangle", (4, 4), "unknown input pattern"),
    ("causal:0", (4, 4), "unknown input pattern"),
    ("causal:x", (4, 4), "unknown input pattern"),
    ("causal:3", (4, 4), "not whole periods"),
    ("causal:4", (4,), "rows of keys"),
])
def test_bad_patterns_name_the_problem(pattern, shape, message):
    g = mi.new_kernel_graph()
    with pytest.raises(GraphError, match=message):
        g.new_input(shape, mi.float16, pattern=pattern)


def test_a_pattern_is_in_the_file_and_hash_only_when_set():
    def graph(pattern: str):
        g = mi.new_kernel_graph()
        g.mark_output(g.exp(g.new_input((4, 4), mi.float16, name="m", pattern=pattern)))
        return g.freeze()

    plain, causal = graph(""), graph("causal:4")
    assert '"pattern"' not in dumps(plain) and '"causal:4"' in dumps(causal)
    assert content_hash(plain) != content_hash(causal)
    assert loads(dumps(causal)).nodes[0].attrs.pattern == "causal:4"
    assert loads(dumps(plain)).nodes[0].attrs.pattern == ""


def test_random_inputs_take_a_patterns_values():
    g = mi.new_kernel_graph()
    x = g.new_input((2, 1, 4), mi.float16)
    m = g.new_input((2, 4, 4), mi.float16, pattern="causal:4")
    g.mark_output(g.add(x, g.reduction(m, 1)))
    plain, masked = random_inputs(g.freeze(), seed=3, device="cpu")
    assert torch.equal(masked, patterns.values("causal:4", (2, 4, 4), torch.float16))
    assert torch.isfinite(plain).all() and plain.std() > 0.5
