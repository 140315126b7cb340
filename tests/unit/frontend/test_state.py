"""A superoptimized module follows its parameters, buffers and submodules (frontend.state): updates in
place are read as they are; replacements and conversions capture the program again."""

import logging
import types

import numpy as np
import pytest
import torch
import torch.nn as nn

import mirage as mi
from mirage.frontend.state import Snapshot


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 8)
        self.register_buffer("scale", torch.full((8,), 2.0))

    def forward(self, x):
        return torch.relu(self.fc(x)) * self.scale


def _fast():
    torch.manual_seed(0)
    model, x = Model(), torch.randn(4, 16)
    return model, x, mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)


def _recaptures(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "capturing it again" in r.getMessage()]


def test_updates_in_place_are_read_without_a_new_capture(caplog):
    model, x, fast = _fast()
    with caplog.at_level(logging.WARNING, logger="mirage.frontend"):
        model.load_state_dict({k: torch.randn_like(v) for k, v in model.state_dict().items()})
        torch.testing.assert_close(fast(x), model(x))
        with torch.no_grad():
            model.fc.weight.mul_(2)
            model.scale.add_(1)
        torch.testing.assert_close(fast(x), model(x))
    assert not _recaptures(caplog) and len(fast.specializations) == 1


@pytest.mark.parametrize("change,said", [
    (lambda m: setattr(m.fc, "weight", nn.Parameter(torch.randn(8, 16))), "parameter fc.weight was replaced"),
    (lambda m: setattr(m, "fc", nn.Linear(16, 8)), "submodule fc was replaced"),
    (lambda m: setattr(m, "scale", torch.full((8,), -1.0)), "buffer scale was replaced"),
    (lambda m: setattr(m.fc.bias, "data", torch.randn(8)), "parameter fc.bias was given new data"),
], ids=["parameter", "submodule", "buffer", "data"])
def test_a_replacement_captures_again_and_computes_with_the_new_tensors(caplog, change, said):
    model, x, fast = _fast()
    fast(x)
    change(model)
    with caplog.at_level(logging.WARNING, logger="mirage.frontend"):
        torch.testing.assert_close(fast(x), model(x))
        torch.testing.assert_close(fast(x), model(x))  # the new capture holds: no third one
    (message,) = _recaptures(caplog)
    assert said in message


def test_a_conversion_to_another_dtype_captures_again():
    model, x, fast = _fast()
    model.double()
    torch.testing.assert_close(fast(x.double()), model(x.double()))
    assert fast.specializations[0].signature.describe().startswith("tensor float64")


def test_the_snapshot_names_what_changed():
    model = Model()
    snapshot = Snapshot.of(model)
    assert snapshot.changed() is None
    model.fc.half()  # parameters get new data; Module.half() would replace the buffer first
    assert snapshot.changed() == ("parameter fc.weight changed from torch.float32 [8, 16] on cpu to "
                                  "torch.float16 [8, 16] on cpu")


class Tempered(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 8)
        self.temperature = 2.0
        self.gated = True

    def forward(self, x):
        y = self.fc(x) / self.temperature
        return torch.relu(y) if self.gated else torch.sigmoid(y)


@pytest.mark.parametrize("change,said", [
    (lambda m: setattr(m, "temperature", 0.5), "attribute temperature changed from 2.0 to 0.5"),
    (lambda m: setattr(m, "gated", False), "attribute gated changed from True to False"),
    (lambda m: m.fc.eval(), "attribute fc.training changed from True to False"),
], ids=["number", "flag", "mode"])
def test_a_plain_attribute_that_changed_captures_again(caplog, change, said):
    _assert_recaptured(Tempered(), change, said, caplog)


def _assert_recaptured(model, change, said: str, caplog) -> None:
    """``change`` of ``model`` after its capture makes the next call capture again, saying ``said``,
    and compute what the changed model computes."""
    torch.manual_seed(0)
    x = torch.randn(4, 16)
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x))
        change(model)
        with caplog.at_level(logging.WARNING, logger="mirage.frontend"):
            torch.testing.assert_close(fast(x), model(x))
    (message,) = _recaptures(caplog)
    assert said in message


def test_an_attribute_set_to_an_equal_value_keeps_the_capture(caplog):
    model, x = Tempered(), torch.randn(4, 16)
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    model.temperature = 4.0 / 2  # another float object, the same value
    with caplog.at_level(logging.WARNING, logger="mirage.frontend"):
        fast(x)
    assert not _recaptures(caplog)


def test_a_call_under_autocast_has_its_own_capture():
    """torch.autocast changes what the program computes (its casts); a capture outside it serves calls
    outside it, and a call under it captures again, with autocast's casts, as eager mode computes."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
    x = torch.randn(8, 32)
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = fast(x), model(x)
        assert got.dtype == want.dtype == torch.bfloat16
        torch.testing.assert_close(got, want, rtol=2e-2, atol=1e-2)  # bfloat16 roundings
    assert fast(x).dtype == torch.float32 and len(fast.specializations) == 2


class Configured(nn.Module):
    """Settings read the way Hugging Face models read them: from a configuration object, a list, a
    dict, a numpy number and a tensor kept as a plain attribute."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(16, 8)
        self.coef = [1.0, 2.0]
        self.table = {"shift": 0.5}
        self.gain = np.float32(1.5)
        self.offset = torch.full((8,), 0.25)

    def forward(self, x):
        y = self.fc(x) * self.config.attention.scale * self.coef[1] + self.table["shift"]
        return y * self.gain + self.offset


def _config():
    return types.SimpleNamespace(attention=types.SimpleNamespace(scale=0.5), name="tiny")


@pytest.mark.parametrize("change,said", [
    (lambda m: setattr(m.config.attention, "scale", 2.0),
     "attribute config.attention.scale changed from 0.5"),
    (lambda m: m.coef.__setitem__(1, 3.0), "attribute coef changed"),
    (lambda m: m.table.update(shift=1.5), "attribute table changed"),
    (lambda m: setattr(m, "gain", np.float32(3.0)), "attribute gain changed"),
    (lambda m: setattr(m, "offset", torch.full((8,), -1.0)), "tensor attribute offset was replaced"),
    (lambda m: m.fc.register_forward_hook(lambda mod, args, out: out * 2), "forward hooks of fc changed"),
], ids=["config", "list", "dict", "numpy", "tensor", "hook"])
def test_settings_beyond_plain_attributes_that_changed_capture_again(caplog, change, said):
    torch.manual_seed(0)
    _assert_recaptured(Configured(_config()), change, said, caplog)


def test_a_configuration_that_every_layer_holds_is_watched_once():
    config = _config()
    model = nn.Sequential(*(Configured(config) for _ in range(4)))
    labels = [label for *_, label, _ in Snapshot.of(model).attributes if ".attention.scale" in label]
    assert labels == ["attribute 0.config.attention.scale"]
    assert Snapshot.of(model).changed() is None


def test_a_hook_removed_captures_again_and_one_elsewhere_does_not(caplog):
    torch.manual_seed(0)
    model, x = Configured(_config()), torch.randn(4, 16)
    handle = model.fc.register_forward_hook(lambda mod, args, out: out * 2)
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="mirage.frontend"):
        nn.Linear(2, 2).register_forward_hook(lambda mod, args, out: out)  # another module's
        torch.testing.assert_close(fast(x), model(x))
        assert not _recaptures(caplog)
        handle.remove()
        torch.testing.assert_close(fast(x), model(x))
    (message,) = _recaptures(caplog)
    assert "forward hooks of fc changed" in message
