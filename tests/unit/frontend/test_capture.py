import pytest
import torch
import torch.fx as fx
import torch.nn as nn

from mirage.frontend.capture import (
    FunctionModule,
    TensorSpec,
    ValueSpec,
    as_module,
    capture,
    check_call,
    signature_of,
)
from mirage.frontend.errors import (
    ExampleInputsError,
    InputCountError,
    InputDeviceError,
    InputDTypeError,
    InputTypeError,
    UnsupportedProgramError,
)

X = torch.zeros(2, 3)


def test_signature_records_tensors_and_values():
    signature = signature_of((X, 2.0), {"flag": True, "maybe": None})
    tensor = TensorSpec((2, 3), torch.float32, torch.device("cpu"))
    assert signature.leaves == (tensor, ValueSpec("float", "2.0"), ValueSpec("bool", "True"),
                                ValueSpec("NoneType", "None"))
    assert signature == signature_of((torch.ones(2, 3), 2.0), {"flag": True, "maybe": None})
    assert signature != signature_of((torch.ones(4, 3), 2.0), {"flag": True, "maybe": None})


CALLS = [
    # captured (args), called (args), error or None
    ((X,), (torch.ones(5, 3),), None),  # a new shape is fine: it re-specializes
    ((X, 1), (X, 2), None),  # so is a new value
    ((X,), (X, X), InputCountError),
    (((X, X),), ([X, X],), InputCountError),  # another container structure
    ((X,), (1.0,), InputTypeError),
    ((X,), (X.double(),), InputDTypeError),
    ((X,), (X.to("meta"),), InputDeviceError),
]


@pytest.mark.parametrize(("captured", "called", "error"), CALLS)
def test_check_call(captured, called, error):
    was, now = signature_of(captured, {}), signature_of(called, {})
    if error is None:
        check_call(was, now, "f")
    else:
        with pytest.raises(error):
            check_call(was, now, "f")


def test_unsupported_leaf_type():
    with pytest.raises(ExampleInputsError, match="input of type set is not supported"):
        signature_of(({1, 2},), {})


def test_as_module():
    linear = nn.Linear(2, 2)
    assert as_module(linear) is linear
    wrapped = as_module(torch.relu)
    assert isinstance(wrapped, FunctionModule) and wrapped.function is torch.relu
    with pytest.raises(UnsupportedProgramError, match="cannot superoptimize a str"):
        as_module("relu")


def test_capture_gives_aten_ops_and_keeps_parameters_as_attributes():
    module = nn.Sequential(nn.Linear(3, 4), nn.SiLU())
    gm = capture(module, (X,), {})
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "aten.linear.default" in targets and "aten.silu.default" in targets
    assert [n.op for n in gm.graph.nodes].count("get_attr") == 2
    torch.testing.assert_close(gm(X), module(X))


def test_capture_of_a_graph_module():
    traced = fx.symbolic_trace(nn.Sequential(nn.Linear(3, 4), nn.ReLU()))
    gm = capture(traced, (X,), {})
    assert any(str(n.target) == "aten.relu.default" for n in gm.graph.nodes)
