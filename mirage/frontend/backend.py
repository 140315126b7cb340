"""The ``torch.compile`` backend: ``torch.compile(model, backend="mirage")``.

Dynamo hands over each captured graph with example inputs; the backend wraps it in a
:class:`~mirage.frontend.runtime.MirageModule`, which captures it at aten level on the first call
for each input signature and runs its subprograms through their µGraphs.  Backend options come from
``torch.compile(..., options={...})`` and are those of ``superoptimize``; ``mode="reduce-overhead"``
stands for ``options={"cuda_graphs": True}``.  When gradients are
needed (training), the graph runs in PyTorch instead, with a one-time notice: mirage kernels are
forward-only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.fx as fx

from mirage.frontend.errors import OptionError
from mirage.frontend.options import Options
from mirage.frontend.runtime import MirageModule

logger = logging.getLogger("mirage.frontend")

BACKEND_NAME = "mirage"


def mirage_backend(gm: fx.GraphModule, example_inputs: Sequence, options: dict | None = None,
                   mode: str | None = None) -> Callable:
    """Dynamo backend entry point (see the module docstring)."""
    if options is not None and not isinstance(options, Mapping):
        raise OptionError(f"torch.compile(..., backend='mirage', options=...) takes a dict of "
                          f"superoptimize's options, got a {type(options).__name__}")
    options = dict(options or {})
    if mode == "reduce-overhead":  # as inductor's: calls replayed from CUDA graphs
        options.setdefault("cuda_graphs", True)
    elif mode not in (None, "default"):  # dynamo passes mode=None when options are given
        logger.warning("mirage: torch.compile's mode=%r has no meaning for the mirage backend; ignoring it "
                       "(pass options={...} instead; mode='reduce-overhead' means cuda_graphs=True)", mode)
    module = MirageModule(gm, Options.parse(**options))
    noticed: list[bool] = []

    def run(*args):
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            if not noticed:
                noticed.append(True)
                logger.warning("mirage: gradients are required, so this graph runs in PyTorch (mirage "
                               "kernels are forward-only; use torch.no_grad() for inference)")
            return gm(*args)
        return module(*args)

    run.mirage_module = module  # type: ignore[attr-defined]
    return run


def register() -> None:
    """Make ``backend="mirage"`` known to torch.compile (no-op when already known, for instance
    through the ``torch_dynamo_backends`` entry point of an installed mirage)."""
    import torch._dynamo

    if BACKEND_NAME not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(mirage_backend, name=BACKEND_NAME)
