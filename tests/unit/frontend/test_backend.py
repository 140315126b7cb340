import logging

import pytest
import torch

from mirage.frontend import OptionError, mirage_backend
from mirage.frontend.examples import EXAMPLES

OPTIONS = {"search": False}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_backend_is_registered_by_name():
    assert "mirage" in torch._dynamo.list_backends(exclude_tags=())


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_compiled_examples_equal_eager(name):
    module, inputs = EXAMPLES[name]()
    compiled = torch.compile(module, backend="mirage", options=OPTIONS)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), module(*inputs), rtol=1e-4, atol=1e-5)
        bigger = tuple(torch.cat([x, x, x]) for x in inputs)
        torch.testing.assert_close(compiled(*bigger), module(*bigger), rtol=1e-4, atol=1e-5)


def test_compiled_graphs_run_through_mirage_subprograms():
    runs = []

    def recording(gm, example_inputs, **kwargs):
        run = mirage_backend(gm, example_inputs, options=OPTIONS)
        runs.append(run)
        return run

    module, inputs = EXAMPLES["gated_mlp"]()
    compiled = torch.compile(module, backend=recording)
    with torch.no_grad():
        compiled(*inputs)
    (run,) = runs
    (spec,) = run.mirage_module.specializations
    assert len(spec.partition.subprograms) == 1
    assert spec.partition.subprograms[0].num_ops == 5  # three matmuls, silu, mul


def test_training_falls_back_to_pytorch_with_a_notice(caplog):
    module, (x,) = EXAMPLES["gated_mlp"]()
    module.train()
    compiled = torch.compile(module, backend="mirage", options=OPTIONS)
    with caplog.at_level(logging.WARNING, logger="mirage.frontend"):
        loss = compiled(x).square().sum()
        loss.backward()
    assert module.gate_proj.weight.grad is not None
    assert any("gradients are required" in r.getMessage() for r in caplog.records)


def test_bad_backend_option_is_reported():
    module, inputs = EXAMPLES["rmsnorm_linear"]()
    compiled = torch.compile(module, backend="mirage", options={"max_subprogram_ops": -1})
    with pytest.raises(Exception) as info, torch.no_grad():
        compiled(*inputs)
    chain = [info.value]
    while chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    assert any(isinstance(e, OptionError) for e in chain) or "max_subprogram_ops" in str(info.value)


def test_backend_options_of_a_wrong_kind_are_reported(caplog):
    module, inputs = EXAMPLES["rmsnorm_linear"]()
    gm = torch.fx.symbolic_trace(module)
    with pytest.raises(OptionError, match="takes a dict of superoptimize's options, got a list"):
        mirage_backend(gm, inputs, options=["search"])
    with caplog.at_level(logging.WARNING, logger="mirage.frontend"):
        mirage_backend(gm, inputs, mode="bogus")
    assert any("mode='bogus' has no meaning" in r.getMessage() for r in caplog.records)
