"""The program's parameters, buffers, submodules and plain attributes as captured: a call after they
were replaced or changed captures again.

A captured graph reads the module's own parameter and buffer tensors, so updates in place
(``load_state_dict``, an optimizer step, ``weight.mul_(2)``) are seen by the next call. A tensor
replaced by another (``model.fc.weight = nn.Parameter(…)``), a submodule replaced
(``model.fc = nn.Linear(…)``) or a conversion that changes a tensor's dtype, shape or device
(``model.half()``) is not what the graph and its kernels were built for, and a plain attribute that
forward reads (``self.temperature``, ``self.use_bias``, ``training`` after ``model.train()``; the
numbers of a configuration object, ``self.config.scale``; lists, tuples and dicts of such values; a
tensor kept as a plain attribute) was made a constant by the capture, as were the forward hooks
registered then: the snapshot taken at capture notices a change of any of them, and the module
captures again at that call (with a notice), instead of computing with the old values.

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

import functools
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn
import torch.nn.modules.module as module_hooks
import torch.utils.hooks as hook_handles


@dataclass(frozen=True)
class Snapshot:
    # (the dict that holds it, its name, the object, its data address for tensors, a label)
    entries: tuple[tuple[dict, str, object, int | None, str], ...]
    layouts: dict[int, tuple]  # id of each tensor held -> (dtype, shape, device) at the snapshot
    # (the module's __dict__, a plain attribute's name, its value, a label): numbers, flags and strings
    # that forward may read (a temperature, a switch, ``training``), which the capture made constants
    # (..., and the value itself where it cannot change in place: identical then means unchanged)
    attributes: tuple[tuple[dict, str, object, str, object], ...] = ()
    # (a hook dict, the hooks' ids then, a label): forward hooks, which the capture traced through
    hooks: tuple[tuple[dict, tuple, str], ...] = ()
    # the id the next hook handle will get, when the hooks last matched: a call compares the hook
    # dicts only when a hook was registered since (anywhere) or one held at capture went
    hook_serial: list[int] = field(default_factory=lambda: [hook_handles.RemovableHandle.next_id])

    @functools.cached_property
    def held_hooks(self) -> tuple[tuple[dict, int], ...]:
        """The hook dicts that held hooks at the snapshot, and how many (a removal shows in the count)."""
        return tuple((store, len(held)) for store, held, _ in self.hooks if held)

    @classmethod
    def of(cls, module: nn.Module) -> Snapshot:
        entries, layouts, attributes, hooks = [], {}, [], []
        visited: set[int] = set()  # configuration objects watched already (a config every layer holds)
        for store, label in ((module_hooks._global_forward_pre_hooks, "global forward pre-hooks"),
                             (module_hooks._global_forward_hooks, "global forward hooks")):
            hooks.append((store, tuple(store), label))
        for path, owner in module.named_modules(remove_duplicate=False):
            prefix = f"{path}." if path else ""
            for store, kind in ((owner._forward_pre_hooks, "forward pre-hooks"),
                                (owner._forward_hooks, "forward hooks")):
                hooks.append((store, tuple(store), f"{kind} of {path or 'the module'}"))
            for name, value in owner.__dict__.items():
                if name.startswith("__") or name in _MODULE_STATE:
                    continue
                if isinstance(value, torch.Tensor):  # a tensor attribute: read as a constant
                    layouts[id(value)] = (value.dtype, value.shape, value.device)
                    entries.append((owner.__dict__, name, value, value.data_ptr(),
                                    f"tensor attribute {prefix}{name}"))
                else:
                    attributes += _attributes(owner.__dict__, name, value, f"attribute {prefix}{name}",
                                              visited)
            for name, child in owner._modules.items():
                entries.append((owner._modules, name, child, None, f"submodule {prefix}{name}"))
            for kind, store in (("parameter", owner._parameters), ("buffer", owner._buffers)):
                for name, tensor in store.items():
                    address = None if tensor is None else tensor.data_ptr()
                    if tensor is not None:
                        layouts[id(tensor)] = (tensor.dtype, tensor.shape, tensor.device)
                    entries.append((store, name, tensor, address, f"{kind} {prefix}{name}"))
        return cls(tuple(entries), layouts, tuple(attributes), tuple(hooks))

    def changed(self) -> str | None:
        """What was replaced or converted since the snapshot (the first such), or None. A call checks
        identities and data addresses only (a conversion such as ``half()`` gives a tensor new data);
        the layouts are read to say what changed."""
        for store, name, held, address, label in self.entries:
            now = store.get(name)
            if now is not held:
                return f"{label} was {'removed' if now is None else 'replaced'}"
            if address is not None and now.data_ptr() != address:
                dtype, shape, device = self.layouts.get(id(held), (now.dtype, now.shape, now.device))
                if (now.dtype, now.shape, now.device) == (dtype, shape, device):  # (or a deep copy's)
                    return f"{label} was given new data"
                return (f"{label} changed from {dtype} {list(shape)} on {device} to {now.dtype} "
                        f"{list(now.shape)} on {now.device}")
        for store, name, held, label, kept in self.attributes:
            value = store.get(name, _MISSING)
            if value is kept:  # a number, string or tuple of them, unchanged: no more to compare
                continue
            now = _frozen(value)
            if type(now) is not type(held) or now != held:
                before = repr(held) if isinstance(held, _SCALARS) else "its value then"
                return f"{label} changed from {before} to {'(deleted)' if value is _MISSING else repr(value)}"
        serial = hook_handles.RemovableHandle.next_id
        if serial != self.hook_serial[0] or any(len(store) != n for store, n in self.held_hooks):
            for store, held, label in self.hooks:
                if tuple(store) != held:
                    return f"the {label} changed"
            self.hook_serial[0] = serial  # registered elsewhere: not ours
        return None


_MISSING = object()
_MUTABLE = object()  # what a list or dict attribute's value is never identical to: compared every call
_SCALARS = (bool, int, float, str, type(None), np.generic)
# a module's own bookkeeping, which the entries and hooks above cover
_MODULE_STATE = frozenset({"_parameters", "_buffers", "_modules", "_forward_hooks", "_forward_pre_hooks",
                           "_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks",
                           "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks",
                           "_state_dict_pre_hooks", "_non_persistent_buffers_set",
                           "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs",
                           "_forward_hooks_always_called", "_is_full_backward_hook"})
_DEPTH = 3  # configuration objects within configuration objects, so deep at most


def _frozen(value: object) -> object:
    """What is compared of ``value``: itself for a number, flag or string; for a list, tuple or dict of
    them (at any depth) a tuple tagged with its type, so that a change in place is seen; None
    (not watched) otherwise."""
    if isinstance(value, _SCALARS) or value is _MISSING:
        return value
    if isinstance(value, (list, tuple)):
        items = tuple(_frozen(v) for v in value)
        return None if any(i is None and v is not None for i, v in zip(items, value, strict=True)) \
            else (type(value).__name__, items)
    if isinstance(value, dict):
        items = tuple((k, _frozen(v)) for k, v in value.items())
        return None if any(not isinstance(k, _SCALARS) or (f is None and value[k] is not None)
                           for k, f in items) else ("dict", items)
    return None


def _immutable(value: object) -> bool:
    return isinstance(value, _SCALARS) or (isinstance(value, tuple) and all(_immutable(v) for v in value))


def _attributes(store: dict, name: str, value: object, label: str, visited: set[int],
                depth: int = 0) -> list[tuple[dict, str, object, str, object]]:
    """Entries for attribute ``name`` of ``store`` (a module's or a configuration object's
    ``__dict__``): its frozen value where it is plain data, or one per attribute of a configuration
    object (a plain object with a ``__dict__``: ``types.SimpleNamespace``, a dataclass, a model
    config), so deep at most; each object once (``visited``: the ids of those watched)."""
    frozen = _frozen(value)
    if frozen is not None or value is None:
        return [(store, name, frozen, label, value if _immutable(value) else _MUTABLE)]
    inner = getattr(value, "__dict__", None)
    if (depth >= _DEPTH or not isinstance(inner, dict) or id(value) in visited
            or isinstance(value, (nn.Module, torch.Tensor, type)) or callable(value)):
        return []
    visited.add(id(value))
    out = []
    for key, item in list(inner.items()):
        if not key.startswith("_"):
            out += _attributes(inner, key, item, f"{label}.{key}", visited, depth + 1)
    return out
