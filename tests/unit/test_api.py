import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

import mirage as mi
from mirage.api import KernelGraphModule
from mirage.frontend import InputCountError, InputDTypeError, InputShapeError, InputTypeError, MirageModule


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MIRAGE_NO_PROGRESS", "1")


def _rmsnorm_graph():
    g = mi.new_kernel_graph("rmsnorm")
    x = g.new_input(dims=(2, 16), dtype=mi.float32, name="X")
    w = g.new_input(dims=(16, 8), dtype=mi.float32, name="W")
    g.mark_output(g.matmul(g.rms_norm(x, eps=1e-6), w))
    return g


X, W = torch.randn(2, 16), torch.randn(16, 8)


def _expected(x, w):
    return F.rms_norm(x, (16,), eps=1e-6) @ w


@pytest.mark.parametrize("form", ["builder", "frozen"])
def test_kernel_graphs(form):
    builder = _rmsnorm_graph()
    graph = builder if form == "builder" else builder.freeze()
    fast = mi.superoptimize(graph, search=False)
    assert isinstance(fast, KernelGraphModule) and fast.graph == builder.freeze()
    (out,) = fast(X, W)
    torch.testing.assert_close(out, _expected(X, W), rtol=1e-5, atol=1e-5)
    (out,) = fast(inputs=[X, W])  # Mirage's calling convention
    torch.testing.assert_close(out, _expected(X, W), rtol=1e-5, atol=1e-5)


def test_builder_superoptimize_method():
    fast = _rmsnorm_graph().superoptimize(search=False)
    torch.testing.assert_close(fast(X, W)[0], _expected(X, W), rtol=1e-5, atol=1e-5)


KERNEL_GRAPH_BAD_INPUTS = [
    ("one input", lambda m: m(X), InputCountError, "takes 2 inputs (f32[2,16], f32[16,8]), got 1"),
    ("both call styles", lambda m: m(X, inputs=[X, W]), InputCountError, "either positionally"),
    ("a list", lambda m: m(X.tolist(), W), InputTypeError, "must be a torch.Tensor of f32[2,16]"),
    ("another shape", lambda m: m(torch.randn(3, 16), W), InputShapeError, "kernel graphs have fixed shapes"),
    ("another dtype", lambda m: m(X.half(), W), InputDTypeError, ".to(torch.float32)"),
]


@pytest.mark.parametrize(("name", "call", "error", "words"), KERNEL_GRAPH_BAD_INPUTS,
                         ids=[b[0] for b in KERNEL_GRAPH_BAD_INPUTS])
def test_kernel_graph_bad_inputs(name, call, error, words):
    fast = mi.superoptimize(_rmsnorm_graph(), search=False)
    with pytest.raises(error, match=None) as info:
        call(fast)
    assert words in str(info.value)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.RMSNorm(16, eps=1e-6)
        self.proj = nn.Linear(16, 8, bias=False)

    def forward(self, x):
        return self.proj(self.norm(x))


@pytest.mark.parametrize("form", ["module", "function", "graph_module", "tensor_example", "list_example"])
def test_programs(form):
    block = Block().eval()
    program, example = {
        "module": (block, (X,)),
        "function": (lambda x: block(x), (X,)),
        "graph_module": (fx.symbolic_trace(block), (X,)),
        "tensor_example": (block, X),
        "list_example": (block, [X]),
    }[form]
    fast = mi.superoptimize(program, example, search=False)
    assert isinstance(fast, MirageModule)
    with torch.no_grad():
        torch.testing.assert_close(fast(X), block(X), rtol=1e-5, atol=1e-5)
    assert fast.partition.subprograms[0].num_ops == 3  # rms_norm, mul (weight), matmul


def test_top_level_entry_is_the_api_entry():
    fast = mi.superoptimize(torch.exp, (X,), search=False)
    torch.testing.assert_close(fast(X), torch.exp(X))


def test_a_worker_importing_the_script_gets_the_program_back_untouched(caplog):
    """Search workers (forkserver / spawn) import the main script as ``__mp_main__``; an unguarded
    top-level call there must not start a search of its own."""
    import mirage as mi

    def mlp(x, w):
        return x @ w

    namespace = {"__name__": "__mp_main__", "mi": mi, "mlp": mlp}
    with caplog.at_level("WARNING", logger="mirage"):
        exec("result = mi.superoptimize(mlp)", namespace)  # what the worker's import runs
    assert namespace["result"] is mlp
    assert 'if __name__ == "__main__":' in caplog.text
