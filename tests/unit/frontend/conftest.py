import pytest


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    """Every test gets its own cache directory and no progress bars."""
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MIRAGE_NO_PROGRESS", "1")
    monkeypatch.delenv("MIRAGE_NO_CACHE", raising=False)
    monkeypatch.delenv("MIRAGE_EXECUTOR", raising=False)
    return tmp_path / "cache"


class SameAddress:
    """A launcher for :class:`~mirage.frontend.executor.Compiled` on the CPU: the graph interpreted,
    each output landing where the same output of the call before did once that one is freed, in a new
    tensor of one version, as CUDA's caching allocator gives a kernel's outputs call after call (what
    the GPU path's caches must not mistake for unchanged tensors)."""

    def __init__(self, graph, in_place: bool = True):
        from mirage.codegen.column_major import strided_reads
        from mirage.frontend.executor import Interpreted

        self.inner, self.buffers, self.last = Interpreted(graph), {}, {}
        # as a compiled program reads them: inputs declared column-major in place (codegen.column_major),
        # or (``in_place=False``, kernels that cannot) none
        self.transposed_inputs = tuple(p for p, i in enumerate(graph.input_nodes)
                                       if in_place and graph.nodes[i].attrs.layout == "col")
        # and views declared with their strides (a head split), read through them; those with split dims
        # (a head split at batch > 1) arrive as the view of those dims
        from mirage.mugraph.graph import split_view

        split = tuple(p for p, i in enumerate(graph.input_nodes) if graph.nodes[i].attrs.split_strides)
        self.input_strides = strided_reads(graph, self.transposed_inputs, split) if in_place else {}
        self.input_views = {p: split_view(graph.nodes[graph.input_nodes[p]].outputs[0].shape,
                                          graph.nodes[graph.input_nodes[p]].attrs.strides,
                                          graph.nodes[graph.input_nodes[p]].attrs.splits())
                            for p in split} if in_place else {}
        self.shapes = [graph.nodes[i].outputs[0].shape for i in graph.input_nodes]

    def launch(self, inputs):
        """A program's launch (what the executor calls first, then :meth:`run`): each input in the
        layout the kernels would read: with its declared strides, column-major where declared, else
        contiguous."""
        from mirage.mugraph.graph import same_strides

        for p, t in enumerate(inputs):
            if p in self.input_views:
                shape, strides = self.input_views[p]
                ready = tuple(t.shape) == shape and same_strides(shape, t.stride(), strides)
            elif p in self.input_strides:
                ready = same_strides(t.shape, t.stride(), self.input_strides[p])
            else:
                ready = t.mT.is_contiguous() if p in self.transposed_inputs else t.is_contiguous()
            assert ready, (p, t.stride())
        return self([t.reshape(shape) for t, shape in zip(inputs, self.shapes, strict=True)])

    run = launch

    def __call__(self, inputs):
        import weakref

        import torch

        outputs = []
        for i, o in enumerate(self.inner(inputs)):
            alive = self.last.get(i) is not None and self.last[i]() is not None
            if alive or i not in self.buffers:  # memory still held by the caller is not handed out
                self.buffers[i] = torch.empty_like(o)
            buffer = self.buffers[i]
            t = torch.empty(0, dtype=o.dtype).set_(buffer.untyped_storage(), 0, o.shape, o.stride())
            outputs.append(t.copy_(o))
            self.last[i] = weakref.ref(t)
        return outputs


def _run_gpu_like(monkeypatch, in_place: bool) -> None:
    from mirage.frontend import runtime
    from mirage.frontend.executor import Compiled

    monkeypatch.setattr(runtime, "make_executor", lambda graph, device, mode="auto", reference=None, *,
                        sass_tune=False, build=None: Compiled(graph, SameAddress(graph, in_place).launch))


@pytest.fixture
def gpu_like(monkeypatch):
    """Subprograms run through the compiled-kernel executor (its input copies and caches), with the
    interpreter behind it and outputs at the same address every call (:class:`SameAddress`)."""
    _run_gpu_like(monkeypatch, True)


@pytest.fixture
def gpu_like_copying(monkeypatch):
    """:func:`gpu_like` with programs that read no input in place: transposed views are copied."""
    _run_gpu_like(monkeypatch, False)
