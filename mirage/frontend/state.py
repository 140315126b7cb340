"""The program's parameters, buffers, submodules and plain attributes as captured: a call after they
were replaced or changed captures again.

A captured graph reads the module's own parameter and buffer tensors, so updates in place
(``load_state_dict``, an optimizer step, ``weight.mul_(2)``) are seen by the next call. A tensor
replaced by another (``model.fc.weight = nn.Parameter(…)``), a submodule replaced
(``model.fc = nn.Linear(…)``) or a conversion that changes a tensor's dtype, shape or device
(``model.half()``) is not what the graph and its kernels were built for, and a plain attribute that
forward reads (``self.temperature``, ``self.use_bias``, ``training`` after ``model.train()``) was made a
constant by the capture: the snapshot taken at capture notices a change of any of them, and the
module captures again at that call (with a notice), instead of computing with the old values.

>>> import torch.nn as nn
>>> model = nn.Linear(4, 2)
>>> snapshot = Snapshot.of(model)
>>> snapshot.changed() is None
True
>>> model.weight = nn.Parameter(model.weight.detach().clone())
>>> snapshot.changed()
'parameter weight was replaced'
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn


@dataclass(frozen=True)
class Snapshot:
    # (the dict that holds it, its name, the object, its data address for tensors, a label)
    entries: tuple[tuple[dict, str, object, int | None, str], ...]
    layouts: dict[int, tuple]  # id of each tensor held -> (dtype, shape, device) at the snapshot
    # (the module's __dict__, a plain attribute's name, its value, a label): numbers, flags and strings
    # that forward may read (a temperature, a switch, ``training``), which the capture made constants
    attributes: tuple[tuple[dict, str, object, str], ...] = ()

    @classmethod
    def of(cls, module: nn.Module) -> Snapshot:
        entries, layouts, attributes = [], {}, []
        for path, owner in module.named_modules(remove_duplicate=False):
            prefix = f"{path}." if path else ""
            for name, value in owner.__dict__.items():
                if _plain(value):
                    attributes.append((owner.__dict__, name, value, f"attribute {prefix}{name}"))
            for name, child in owner._modules.items():
                entries.append((owner._modules, name, child, None, f"submodule {prefix}{name}"))
            for kind, store in (("parameter", owner._parameters), ("buffer", owner._buffers)):
                for name, tensor in store.items():
                    address = None if tensor is None else tensor.data_ptr()
                    if tensor is not None:
                        layouts[id(tensor)] = (tensor.dtype, tensor.shape, tensor.device)
                    entries.append((store, name, tensor, address, f"{kind} {prefix}{name}"))
        return cls(tuple(entries), layouts, tuple(attributes))

    def changed(self) -> str | None:
        """What was replaced or converted since the snapshot (the first such), or None. A call checks
        identities and data addresses only (a conversion such as ``half()`` gives a tensor new data);
        the layouts are read to say what changed."""
        for store, name, held, address, label in self.entries:
            now = store.get(name)
            if now is not held:
                return f"{label} was {'removed' if now is None else 'replaced'}"
            if address is not None and now.data_ptr() != address:
                dtype, shape, device = self.layouts[id(held)]
                if (now.dtype, now.shape, now.device) == (dtype, shape, device):
                    return f"{label} was given new data"
                return (f"{label} changed from {dtype} {list(shape)} on {device} to {now.dtype} "
                        f"{list(now.shape)} on {now.device}")
        for store, name, held, label in self.attributes:
            now = store.get(name, _MISSING)
            if now is not held and (type(now) is not type(held) or now != held):
                return f"{label} changed from {held!r} to {'(deleted)' if now is _MISSING else repr(now)}"
        return None


_MISSING = object()
_SCALARS = (bool, int, float, str, type(None))


def _plain(value: object) -> bool:
    """A value that forward may read as a constant: a number, flag, string or None, or a tuple of them."""
    return isinstance(value, _SCALARS) or (isinstance(value, tuple) and all(isinstance(v, _SCALARS)
                                                                              for v in value))
