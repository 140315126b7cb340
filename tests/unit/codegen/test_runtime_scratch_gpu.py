"""Program launches on a GPU: a tensor that only the program's kernels read is kept from call to call
(per stream), and what the program returns is fresh in each call; a launch under CUDA graph capture
and on another stream gives the same results."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

from test_runtime import two_kernels  # noqa: E402

from mirage.codegen.runtime import compile_chosen  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def expected(x):
    return torch.exp(torch.exp(x.double())).to(torch.float16)


@pytest.mark.parametrize("dependent", [True, False])
def test_calls_keep_scratch_and_return_fresh_outputs(dependent):
    program = dataclasses.replace(compile_chosen(two_kernels(False, False)), dependent_launch=dependent)
    xs = [torch.rand(8, 64, device="cuda", dtype=torch.float16) - 0.5 * k for k in range(3)]
    outs = [program.launch([x])[0] for x in xs]  # no synchronization between the calls
    torch.cuda.synchronize()
    for x, out in zip(xs, outs, strict=True):
        torch.testing.assert_close(out, expected(x), rtol=2e-3, atol=2e-3)
    assert len({o.data_ptr() for o in outs}) == len(outs)  # each call's result is its own
    (scratch,) = program._scratches.values()
    assert len(scratch.tensors) == 1  # the middle tensor, kept

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        (on_side,) = program.launch([xs[1]])
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(on_side, expected(xs[1]), rtol=2e-3, atol=2e-3)
    assert len(program._scratches) == 2  # one per stream

    static = xs[2].clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        (captured,) = program.launch([static])
    for x in xs:
        static.copy_(x)
        graph.replay()
        torch.testing.assert_close(captured, expected(x), rtol=2e-3, atol=2e-3)
    assert len(program._scratches) == 2  # the capture allocated its own


def test_a_returned_middle_tensor_is_fresh_in_each_call():
    program = compile_chosen(two_kernels(True, False))
    x, y = (torch.rand(8, 64, device="cuda", dtype=torch.float16) for _ in range(2))
    (_, middle_x), (_, middle_y) = program.launch([x]), program.launch([y])
    torch.testing.assert_close(middle_x, torch.exp(x.float()).half(), rtol=2e-3, atol=2e-3)
    assert middle_x.data_ptr() != middle_y.data_ptr()


def test_threads_calling_on_one_stream_get_their_own_results():
    program = compile_chosen(two_kernels(False, False))
    xs = [torch.rand(8, 64, device="cuda", dtype=torch.float16) - 0.1 * k for k in range(8)]
    program.launch([xs[0]])  # loaded, plan made
    results: dict[int, list] = {}

    def calls(k):
        results[k] = [program.launch([xs[k]])[0] for _ in range(50)]

    import threading

    threads = [threading.Thread(target=calls, args=(k,)) for k in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    for k, outs in results.items():
        for out in outs:
            torch.testing.assert_close(out, expected(xs[k]), rtol=2e-3, atol=2e-3)
