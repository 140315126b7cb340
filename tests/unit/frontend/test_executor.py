import numpy as np
import pytest
import torch

import mirage as mi
from mirage.frontend.errors import ExecutorError
from mirage.frontend.executor import Compiled, Interpreted, make_executor


def _graph(dtype=mi.float32):
    g = mi.new_kernel_graph("g")
    x = g.new_input(dims=(2, 3), dtype=dtype)
    w = g.new_input(dims=(3, 4), dtype=dtype)
    g.mark_output(g.matmul(x, w))
    return g.freeze()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_interpreted_returns_the_graph_dtype(dtype):
    graph = _graph(mi.DType.parse(dtype))
    x, w = torch.randn(2, 3, dtype=dtype), torch.randn(3, 4, dtype=dtype)
    (out,) = Interpreted(graph)([x, w])
    assert out.dtype == dtype and out.shape == (2, 4)
    exact = x.double() @ w.double()
    assert (out.double() - exact).abs().max() <= np.finfo(np.float16).eps * 8


def test_make_executor_modes():
    graph = _graph()
    assert isinstance(make_executor(graph, torch.device("cpu")), Interpreted)
    assert isinstance(make_executor(graph, torch.device("cpu"), "interpret"), Interpreted)
    with pytest.raises(ExecutorError, match="needs CUDA tensors"):
        make_executor(graph, torch.device("cpu"), "cuda")


def test_compiled_copies_views_once_while_they_are_unchanged():
    seen = []

    def launch(inputs):
        seen.append([t.data_ptr() for t in inputs])
        return [inputs[0] @ inputs[1]]

    executor = Compiled(_graph(), launch)
    x, weight = torch.randn(2, 3), torch.randn(4, 3)
    (first,) = executor([x, weight.t()])
    (second,) = executor([x, weight.t()])
    torch.testing.assert_close(first, x @ weight.t())
    assert seen[0][1] == seen[1][1] != weight.data_ptr()  # one contiguous copy, reused
    assert seen[0][0] == x.data_ptr()  # contiguous inputs are passed as they are
    weight.mul_(2.0)  # an in-place change bumps the version: the copy is refreshed
    (third,) = executor([x, weight.t()])
    torch.testing.assert_close(third, x @ weight.t())


def _fake_codegen(monkeypatch, failing):
    from mirage.frontend import executor as module

    def launcher(graph, build=None):
        if graph in failing:
            raise RuntimeError("nvcc failed")
        return lambda inputs: [inputs[0] @ inputs[1]]

    monkeypatch.setattr(module, "codegen_launcher", launcher)


def test_cuda_falls_back_to_the_reference_graph_when_the_chosen_one_does_not_compile(monkeypatch, caplog):
    chosen, reference = _graph(), mi.parse(str(_graph()).replace('"g"', '"ref"'))
    _fake_codegen(monkeypatch, failing={chosen})
    executor = make_executor(chosen, torch.device("cuda"), "auto", reference)
    assert isinstance(executor, Compiled) and executor.graph is reference
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "did not compile for the GPU (RuntimeError: nvcc failed)" in messages
    assert "runs its unfused reference graph instead" in messages
    with pytest.raises(RuntimeError, match="nvcc failed"):
        make_executor(chosen, torch.device("cuda"), "cuda", reference)


def test_cuda_without_any_compiled_form_interprets(monkeypatch, caplog):
    chosen = _graph()
    _fake_codegen(monkeypatch, failing={chosen})
    executor = make_executor(chosen, torch.device("cuda"), "auto")
    assert isinstance(executor, Interpreted)
    assert any("reference interpreter on the CPU" in r.getMessage() for r in caplog.records)
