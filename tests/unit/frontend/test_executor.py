import numpy as np
import pytest
import torch

import mirage as mi
from mirage.frontend.errors import ExecutorError
from mirage.frontend.executor import Compiled, Interpreted, make_executor
from tests.unit.frontend.frontend_calls import recording_launch


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
    executor = Compiled(_graph(), recording_launch(seen))
    executor.constants = frozenset({1})  # the weight is a parameter
    x, weight = torch.randn(2, 3), torch.randn(4, 3)
    (first,) = executor([x, weight.t()])
    (second,) = executor([x, weight.t()])
    torch.testing.assert_close(first, x @ weight.t())
    assert seen[0][1] == seen[1][1] != weight.data_ptr()  # one contiguous copy, reused
    assert seen[0][0] == x.data_ptr()  # contiguous inputs are passed as they are
    weight.mul_(2.0)  # an in-place change bumps the version: the copy is refreshed
    (third,) = executor([x, weight.t()])
    torch.testing.assert_close(third, x @ weight.t())
    assert executor.copies_constants


def test_compiled_knows_a_parameter_passed_as_an_input():
    """torch.compile passes parameters as inputs of its graphs: an nn.Parameter's view is a constant."""
    seen = []
    executor = Compiled(_graph(), recording_launch(seen, 1))
    x, weight = torch.randn(2, 3), torch.nn.Parameter(torch.randn(4, 3), requires_grad=False)
    executor([x, weight.t()])
    executor([x, weight.t()])
    assert seen[0] == seen[1] and executor.copies_constants
    with torch.no_grad():
        weight.mul_(-1)
    (out,) = executor([x, weight.t()])
    torch.testing.assert_close(out, x @ weight.t())


def test_compiled_copies_a_view_of_an_activation_at_every_call():
    """An activation's view is copied every time, even at an address and version seen before."""
    seen = []
    executor = Compiled(_graph(), recording_launch(seen, 1))
    x, y = torch.randn(2, 3), torch.randn(4, 3)
    executor([x, y.t()])
    y.data.copy_(torch.randn(4, 3))  # new values, the version counter unchanged
    (out,) = executor([x, y.t()])
    torch.testing.assert_close(out, x @ y.t())
    assert not executor.copies_constants


def test_a_subprogram_reading_the_one_before_transposed_sees_each_call_values(gpu_like):
    """The keys of attention computed by one subprogram and read transposed by the next: the copy of
    the transposed view is made anew each call (it was reused while the address and version matched,
    and the second call computed with the first call's keys)."""

    def program(q, k):
        return torch.softmax(q @ (torch.relu(k) * 2).transpose(-1, -2), dim=-1)

    torch.manual_seed(0)
    fast = mi.superoptimize(program, (torch.randn(2, 16, 8), torch.randn(2, 16, 8)), search=False,
                            use_cache=False, progress=False)
    assert len(fast.partition.subprograms) == 2
    for _ in range(3):
        q, k = torch.randn(2, 16, 8), torch.randn(2, 16, 8)
        torch.testing.assert_close(fast(q, k), program(q, k))


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


@pytest.mark.parametrize("searched", [False, True])
def test_softmax_of_large_and_fully_masked_logits_matches_torch(searched):
    """A softmax whose logits overflow exp (~1000) or sit far below zero in a whole row (an additive
    mask of -1e4 on a padded row) gives PyTorch's answer, not inf / inf or 0 / 0: the executor runs
    each exp less its row maximum."""

    def masked_softmax(scores, mask):
        return torch.softmax(scores + mask, dim=-1)

    scores = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)) * 1000
    mask = torch.zeros(4, 8)
    mask[3] = -1e4
    options = {"search": True, "time_limit_s": 8, "search_overrides": {"workers": 1}} if searched else \
        {"search": False}
    fast = mi.superoptimize(masked_softmax, (scores, mask), use_cache=False, progress=False, **options)
    expected = torch.softmax(scores.double() + mask.double(), -1)
    got = fast(scores, mask)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-6)


def test_compiled_checks_a_programs_inputs_on_its_first_call_only(monkeypatch):
    """The first call goes through Program.launch's checks; later calls, whose inputs keep the
    specialization's shapes, dtypes and device, through Program.run."""
    from mirage.codegen.runtime import LaunchError, Program, compile_chosen

    graph = _graph()
    program = compile_chosen(graph)  # kernel-level ops only: runs on the CPU through torch
    executor = Compiled(graph, program.launch)
    x, w = torch.randn(2, 3), torch.randn(3, 4)
    with pytest.raises(LaunchError, match="expected torch.float32"):
        executor([x.double(), w.double()])
    (first,) = executor([x, w])

    def checked(self, inputs):
        raise AssertionError("checked again")

    monkeypatch.setattr(Program, "launch", checked)
    (second,) = executor([x, w])
    torch.testing.assert_close(first, x @ w)
    torch.testing.assert_close(second, x @ w)
    other = Compiled(graph, lambda inputs: [inputs[0] @ inputs[1]])  # any launcher: called as it is
    torch.testing.assert_close(other([x, w])[0], x @ w)
    torch.testing.assert_close(other([x, w])[0], x @ w)


def test_a_capture_records_a_parameter_copy_unless_it_reads_the_calls_copies(monkeypatch):
    """A caller's CUDA graph makes its own copy of a transposed parameter; a capture standing for
    calls, or one of a module built with ``reuse_copies_in_graphs``, reads the copy the calls keep,
    which a call after an in-place update refreshes at the same address."""
    from mirage.frontend import graphs

    seen = []
    executor = Compiled(_graph(), recording_launch(seen, 1))
    executor.constants = frozenset({1})
    x, weight = torch.randn(2, 3), torch.randn(4, 3)
    executor([x, weight.t()])
    kept = seen[-1]
    monkeypatch.setattr(graphs, "capturing", lambda tensors: True)  # as inside torch.cuda.graph
    executor([x, weight.t()])
    assert seen[-1] != kept  # recorded: a replay copies again
    with graphs.standing_for_calls():
        executor([x, weight.t()])
    assert seen[-1] == kept
    executor.reuse_in_graphs = True
    executor([x, weight.t()])
    assert seen[-1] == kept
    monkeypatch.setattr(graphs, "capturing", lambda tensors: False)
    weight.mul_(-1)
    (out,) = executor([x, weight.t()])  # a call after the update: the same copy, new values
    assert seen[-1] == kept
    torch.testing.assert_close(out, x @ weight.t())


def test_the_report_counts_the_kept_copies_of_transposed_weights(gpu_like_copying):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32, bias=False), torch.nn.ReLU(),
                                torch.nn.Linear(32, 8, bias=False)).eval()
    x = torch.randn(4, 16)
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    assert "kept copies" not in fast.report()  # none made before a call
    with torch.no_grad():
        fast(x)
    report = fast.report()
    assert "kept copies: 2 parameter(s) or buffer(s) read as strided views (a transposed weight)" in report
    assert "(a rotary table over the heads), 3 KiB, made again" in report
    # (16 · 32 + 32 · 8) float32 elements: 3,072 bytes


def test_weights_read_in_place_keep_no_copies_and_see_updates(gpu_like):
    """Programs that read nn.Linear's weight.T in place (codegen.column_major) get the parameter's
    view itself: nothing kept, and an in-place update is seen at the next call."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 32, bias=False), torch.nn.ReLU(),
                                torch.nn.Linear(32, 8, bias=False)).eval()
    x = torch.randn(4, 16)
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(fast(x), model(x))
            model[0].weight.mul_(-1)
    assert "kept copies" not in fast.report()
    assert "read in place: 2 input(s) arriving transposed or as views, no copy (" in fast.report()
