"""The CUDA path: generated kernels through mirage.codegen (marked ``gpu``; skipped without CUDA)."""

import pytest
import torch

import mirage as mi
from mirage.frontend.examples import EXAMPLES
from mirage.frontend.executor import Compiled
from mirage.frontend.runtime import SubprogramModule

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_examples_on_the_gpu_equal_eager(name):
    module, inputs = EXAMPLES[name](4)
    module = module.cuda().half()
    inputs = tuple(x.cuda().half() for x in inputs)
    fast = mi.superoptimize(module, inputs, search=False)
    with torch.no_grad():
        torch.testing.assert_close(fast(*inputs), module(*inputs), rtol=2e-2, atol=2e-2)
    runners = [m for m in fast.specializations[0].module.modules() if isinstance(m, SubprogramModule)]
    assert all(isinstance(r.executor(inputs[0].device), Compiled) for r in runners)
