"""Capturing a PyTorch program as an aten-level fx graph, and the signature calls are checked against.

``torch.export`` (non-strict) traces an ``nn.Module``, a plain function or an ``fx.GraphModule`` (the
graphs Dynamo hands to a ``torch.compile`` backend) for concrete inputs.  Its graph keeps the
high-level aten ops the lowering table knows (``linear``, ``rms_norm``, ``softmax``,
``scaled_dot_product_attention``); parameters become ``get_attr`` nodes of the returned module.

A :class:`Signature` records, for the flattened inputs of a call, each tensor's shape, dtype and
device and each other value.  Shapes and values select a specialization; dtypes, devices, the
number and the kinds of inputs must match the first capture (:func:`check_call`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree

from mirage.frontend import (
    activations,
    decompositions,
    fill_masks,
    hidden_rows,
    products,
    selections,
    softmaxes,
)
from mirage.frontend.errors import (
    CaptureError,
    ExampleInputsError,
    InputCountError,
    InputDeviceError,
    InputDTypeError,
    InputTypeError,
    UnsupportedProgramError,
)
from mirage.mugraph import patterns

logger = logging.getLogger("mirage.frontend")


class FunctionModule(nn.Module):
    """Wraps a plain function so that torch.export can trace it.  The modules it calls are held as
    submodules (:func:`held_modules`: the owner of a bound method such as ``model.forward``, and those
    the function reads from its closure or by a global name), so that their parameters and buffers
    are the captured program's own: replacing or converting one, ``model.eval()`` or a changed
    attribute is noticed at the next call (``frontend.state``), as for a module passed itself."""

    def __init__(self, function: Callable) -> None:
        super().__init__()
        self.function = function
        for name, module in held_modules(function).items():
            if not hasattr(self, name):  # a name nn.Module uses itself (``train``) is left out
                self.add_module(name, module)

    def forward(self, *args, **kwargs):
        return self.function(*args, **kwargs)


def held_modules(function: Callable) -> dict[str, nn.Module]:
    """The modules that ``function`` runs, by a name for each: the owner of a bound method
    (``"self"``), and the modules it reads from its closure or its globals (by their variable names)."""
    if isinstance(function, functools.partial):
        return held_modules(function.func)
    held: dict[str, nn.Module] = {}
    owner = getattr(function, "__self__", None)
    if inspect.ismethod(function) and isinstance(owner, nn.Module):
        held["self"] = owner
    code = getattr(function, "__code__", None)
    if code is None:
        return held
    for name, cell in zip(code.co_freevars, getattr(function, "__closure__", None) or (), strict=False):
        try:
            value = cell.cell_contents
        except ValueError:  # a cell not yet filled
            continue
        if isinstance(value, nn.Module):
            held.setdefault(name, value)
    scope = getattr(function, "__globals__", None) or {}
    for name in code.co_names:
        if isinstance(scope.get(name), nn.Module):
            held.setdefault(name, scope[name])
    return held


def program_name(program: Any) -> str:
    if isinstance(program, FunctionModule):
        program = program.function
    return getattr(program, "__qualname__", None) or type(program).__name__


def as_module(program: Any) -> nn.Module:
    if isinstance(program, nn.Module):
        return program
    if callable(program):
        return FunctionModule(program)
    raise UnsupportedProgramError(
        f"cannot superoptimize a {type(program).__name__}: pass a torch.nn.Module, a function of "
        "tensors, a torch.fx.GraphModule, or a kernel graph built with mirage.new_kernel_graph()")


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    def describe(self) -> str:
        return f"tensor {str(self.dtype).removeprefix('torch.')}{list(self.shape)} on {self.device}"


@dataclass(frozen=True)
class ValueSpec:
    type_name: str
    value: str  # repr: values are specialized on, like shapes

    def describe(self) -> str:
        return f"{self.type_name} {self.value}"


LeafSpec = TensorSpec | ValueSpec


@dataclass(frozen=True)
class Signature:
    tree: str  # the pytree structure of (args, kwargs)
    leaves: tuple[LeafSpec, ...]
    keywords: tuple[str, ...] = ()  # the names of the inputs passed by keyword, sorted
    positional: int = 0  # how many inputs were passed by position

    def describe(self) -> str:
        return ", ".join(leaf.describe() for leaf in self.leaves) or "no inputs"


_VALUE_TYPES = (int, float, bool, str, type(None))


def signature_of(args: tuple, kwargs: dict) -> Signature:
    leaves, tree = pytree.tree_flatten((tuple(args), dict(kwargs)))
    specs: list[LeafSpec] = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            specs.append(TensorSpec(tuple(int(s) for s in leaf.shape), leaf.dtype, leaf.device))
        elif isinstance(leaf, _VALUE_TYPES):
            specs.append(ValueSpec(type(leaf).__name__, repr(leaf)))
        else:
            raise ExampleInputsError(
                f"input of type {type(leaf).__name__} is not supported ({leaf!r:.60}): pass tensors, "
                "numbers, strings or None (in tuples, lists or dicts), and fix other values in the "
                "program itself (superoptimize functools.partial(f, dtype=torch.float16), or a module "
                "that holds the value as an attribute)")
    return Signature(str(tree), tuple(specs), tuple(sorted(kwargs)), len(args))


def conform_call(program: nn.Module, first: tuple[int, tuple[str, ...]], args: tuple,
                 kwargs: dict) -> tuple[tuple, dict]:
    """The call's inputs in the structure of the first capture (``first``: how many inputs it passed
    by position, and the names it passed by keyword), bound to ``program``'s parameters by name, so
    that ``f(x, y=y)`` runs what ``f(x, y)`` captured.  Unchanged where they do not bind so."""
    count, names = first
    if len(args) == count and tuple(kwargs) == names:
        return args, kwargs
    function = program.function if isinstance(program, FunctionModule) else program.forward
    try:
        signature = inspect.signature(function)
        bound = signature.bind(*args, **kwargs)
    except (TypeError, ValueError):
        return args, kwargs
    order = list(signature.parameters)
    kinds = {p.kind for p in signature.parameters.values()}
    wanted = order[:count] + list(names)
    if kinds & {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD} or \
            sorted(bound.arguments) != sorted(wanted) or len(order) < count:
        return args, kwargs
    return tuple(bound.arguments[p] for p in order[:count]), {k: bound.arguments[k] for k in names}


def check_call(captured: Signature, call: Signature, name: str) -> None:
    """Raise the InputError that explains how ``call`` differs from ``captured`` (shapes may differ)."""
    def passed(s: Signature) -> str:
        return f"{s.positional} input(s) by position and {', '.join(s.keywords) or 'none'} by keyword"

    # inputs passed by keyword where the first call passed others (an optional input given or left out)
    keywords = "" if captured.keywords == call.keywords else (
        f"; it was captured with {passed(captured)}, and is called with {passed(call)}: pass the same "
        "inputs as the first call (None where it passed None), or superoptimize the program again for "
        "calls like this one")
    if len(captured.leaves) != len(call.leaves):
        described = call.describe()
        described = described if len(described) <= 300 else described[:300] + " ..."
        raise InputCountError(
            f"{name} was captured with {len(captured.leaves)} input(s) ({captured.describe()}) but is "
            f"called with {len(call.leaves)} ({described})" + (keywords or "; pass the same inputs (a list "
                                                               "or tuple passed where a tensor was counts "
                                                               "as its elements: pass a tensor)"))
    if captured.tree != call.tree:
        raise InputCountError(
            f"{name} was captured with its {len(captured.leaves)} input(s) in another structure than "
            "this call's (nested in other tuples, lists or dicts, or keywords that are not its "
            "parameters' names)" + (keywords or "; pass them as in the first call"))
    for i, (was, now) in enumerate(zip(captured.leaves, call.leaves, strict=True)):
        if type(was) is not type(now):
            raise InputTypeError(f"input {i} of {name} was captured as a {was.describe()} but is now a "
                                 f"{now.describe()}; pass the same kind of value")
        if isinstance(was, TensorSpec) and isinstance(now, TensorSpec):
            if was.dtype != now.dtype:
                raise InputDTypeError(
                    f"input {i} of {name} has dtype {now.dtype}, but it was captured with {was.dtype}; "
                    f"convert it with .to({was.dtype}) or superoptimize again with inputs of {now.dtype}")
            if was.device != now.device and now.device.type == "meta":
                raise InputDeviceError(
                    f"input {i} of {name} is on meta, but it was captured on {was.device}; move it with "
                    f".to('{was.device}') (the 'meta' device holds shapes but no values to compute with)")
            if was.device != now.device:
                raise InputDeviceError(
                    f"input {i} of {name} is on {now.device}, but it was captured on {was.device}; move it "
                    f"with .to('{was.device}') or superoptimize the model again on {now.device}")


def capture(module: nn.Module, args: tuple, kwargs: dict, merge_products: bool = True) -> fx.GraphModule:
    """The aten-level graph module of ``module`` for these inputs (parameters as attributes).
    ``merge_products``: sibling products that are only reshaped become one product of their stacked
    weights (:func:`products.merged_products`)."""
    name = program_name(module)
    tensors = (*module.named_parameters(), *module.named_buffers())
    made_in_inference = [n for n, t in tensors if t.is_inference()]
    if made_in_inference:
        raise CaptureError(
            f"{name}'s {made_in_inference[0]} (and {len(made_in_inference) - 1} more) was created under "
            "torch.inference_mode(), and torch.export cannot trace such tensors: build or load the model "
            "outside inference mode (torch.no_grad() is fine), then superoptimize it under either")
    on_meta = [n for n, t in tensors if t.device.type == "meta"] + [
        f"input {k}" for k, x in enumerate(pytree.tree_leaves((args, kwargs)))
        if isinstance(x, torch.Tensor) and x.device.type == "meta"]
    if on_meta:
        raise InputDeviceError(
            f"{name}'s {on_meta[0]} (and {len(on_meta) - 1} more) is on the 'meta' device, which holds "
            "shapes but no values: mirage runs and checks programs on their values, so pass tensors on "
            "'cpu' or 'cuda' (a model built on 'meta' needs its weights loaded first)")
    args, kwargs = _unaliased(args, kwargs)
    try:
        with torch.inference_mode(False):
            # an input made under torch.inference_mode() traces as a copy made outside it
            args, kwargs = pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) and
                                           x.is_inference() else x, (args, kwargs))
            exported = torch.export.export(module, tuple(args), dict(kwargs), strict=False)
    except Exception as error:  # torch raises many types here; all mean "could not trace"
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        shapes = ", ".join(str(tuple(x.shape)) for x in pytree.tree_leaves((args, kwargs))
                           if isinstance(x, torch.Tensor))
        raise CaptureError(
            f"torch.export could not capture {name} on inputs of shapes {shapes or 'none'}: "
            f"{type(error).__name__}: {first[:300]}. If the program fails on such inputs in eager mode "
            "too, pass inputs it takes; otherwise make the forward traceable (no Python branches on "
            "tensor values, no .item()), or superoptimize only the traceable part") from error
    exported = _functional(exported)
    gm = exported.module()
    _dtype_arguments_as_casts(gm)
    _repeats_as_expands(gm)
    softmaxes.stable_softmaxes(gm)
    softmaxes.shifted_softmaxes(gm)
    activations.erf_gelus(gm)
    selections.slice_concats_as_products(gm)
    selections.interleaved_stacks_as_products(gm)
    _drop_value_asserts(gm)
    decompositions.drop_identity_dropouts(gm)
    _softmax_round_trips(gm)
    _scalar_fulls(gm)
    products.split_products(gm)
    if merge_products:
        products.merged_products(gm)
    _explicit_causal_masks(gm)
    _additive_bool_masks(gm)
    fill_masks.where_fills(gm)
    fill_masks.additive_fills(gm)
    fill_masks.causal_buffers(gm)
    hidden_rows.safe_attention_rows(gm)
    return gm


def _unaliased(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The inputs with each tensor that shares memory with an earlier one copied. torch.export traces
    aliased inputs as one (``f(x, x)`` gives a graph that reads its first input nowhere), so a capture
    on them would give wrong results for any later call with distinct tensors (self-attention called
    as ``attn(x, x, x)``). The copies only trace: capture runs nothing on them."""
    seen: set[tuple] = set()

    def distinct(x):
        if not isinstance(x, torch.Tensor) or x.device.type == "meta":
            return x
        key = (x.untyped_storage().data_ptr(), x.device) if x.numel() else (id(x), x.device)
        if key in seen:
            return x.clone()
        seen.add(key)
        return x

    return pytree.tree_map(distinct, (tuple(args), dict(kwargs)))


def _mutates(node: fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and schema is not None and schema.is_mutable


def updates_state(gm: fx.GraphModule) -> bool:
    """Whether the captured program writes into its own parameters or buffers (a KV cache, a counter,
    running statistics): running it changes the module, so nothing may run it but the caller."""
    return any(_mutates(n) and n.args and isinstance(n.args[0], fx.Node) and n.args[0].op == "get_attr"
               for n in gm.graph.nodes)


def updates_inputs(graph: fx.Graph) -> bool:
    """Whether the captured program writes into one of its inputs (``x.add_(1)`` in forward, run as a
    copy back into the input): a call must then run on the caller's tensors themselves."""
    return any(_mutates(n) and n.args and isinstance(n.args[0], fx.Node) and n.args[0].op == "placeholder"
               for n in graph.nodes)


def _functional(exported: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``exported`` with its in-place ops (``relu_``, ``add_``, ``nn.ReLU(inplace=True)``) made
    out-of-place, so that the lowering, which knows only the functional ops, fuses them with their
    neighbours instead of leaving each in PyTorch and splitting the subprogram there, and the ops of
    :mod:`~mirage.frontend.decompositions` written as the ops they stand for.  No other op is
    decomposed.  Updates of the inputs and buffers stay: the module runs them as copies back into
    those tensors after the functional graph, as eager mode would.  A program that the pass cannot
    take is kept as it was (its in-place and composite ops then run in PyTorch)."""
    present = decompositions.present(exported.graph)
    if not decompositions.composite(present) and not any(_mutates(node) for node in exported.graph.nodes):
        return exported
    try:
        with warnings.catch_warnings():  # torch's own deprecation notices from inside the pass
            warnings.simplefilter("ignore", FutureWarning)
            return exported.run_decompositions(decompositions.table(present))
    except Exception as error:  # noqa: BLE001 - the program as captured still runs, those ops in PyTorch
        logger.info("mirage: in-place and composite ops stay in PyTorch: rewriting them failed (%s: %s)",
                    type(error).__name__, str(error).splitlines()[0][:200] if str(error) else "")
        return exported


# ops whose ``dtype`` argument casts their operand first (``softmax(x, -1, dtype=torch.float32)`` is
# ``softmax(x.to(torch.float32), -1)``)
_DTYPE_CASTS = (torch.ops.aten.softmax.int, torch.ops.aten.log_softmax.int, torch.ops.aten.sum.dim_IntList,
                torch.ops.aten.sum.default, torch.ops.aten.mean.dim, torch.ops.aten.mean.default)


def _dtype_arguments_as_casts(gm: fx.GraphModule) -> None:
    """Write an op's ``dtype`` argument (a float16 softmax or sum computed in float32) as a cast of its
    operand before it, so that the cast meets the rules of every other upcast (the ``upcasts`` option:
    by default it runs in PyTorch and the op reads the wider values) instead of the op being computed
    in the operand's dtype and only its result widened."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _DTYPE_CASTS:
            continue
        names = [a.name for a in node.target._schema.arguments]
        position = names.index("dtype")
        dtype = node.args[position] if position < len(node.args) else node.kwargs.get("dtype")
        operand = node.args[0]
        if dtype is None or not isinstance(operand, fx.Node) or operand.meta["val"].dtype == dtype:
            continue
        with gm.graph.inserting_before(node):
            cast = gm.graph.call_function(torch.ops.aten.to.dtype, (operand, dtype))
        cast.meta["val"] = operand.meta["val"].to(dtype)
        args = [cast, *node.args[1:]]
        if position < len(args):
            args[position] = None
        node.args = tuple(args)
        node.kwargs = {k: v for k, v in node.kwargs.items() if k != "dtype"}
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()


_NARROW_FLOATS = (torch.float16, torch.bfloat16)


def _float_cast(node: object, before: torch.dtype | None, after: torch.dtype) -> fx.Node | None:
    """The operand of ``node`` when ``node`` is a cast (as the lowering reads one) from ``before`` (any
    dtype when None) to ``after`` that keeps shape and device; else None."""
    from mirage.frontend.lowering import cast_values  # (the lowering imports this module)

    values = cast_values(node) if isinstance(node, fx.Node) else None
    if values is None:
        return None
    held, val = values
    same = held.shape == val.shape and held.device == val.device
    return node.args[0] if same and val.dtype == after and before in (None, held.dtype) else None


def _softmax_round_trips(gm: fx.GraphModule) -> None:
    """Write ``softmax(x.float(), d).to(x.dtype)`` of a float16 or bfloat16 ``x`` (Hugging Face's
    ``softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)``, T5's ``softmax(s.float()).type_as(s)``)
    as ``softmax(x, d)``: PyTorch computes a half-precision softmax in float32 and rounds its result
    once, so both are the same function (at most one unit in the last place apart, where the two
    kernels sum in another order; a test checks it on the CPU and on the GPU).
    Without this the float32 island stays in PyTorch (``upcasts="exact"``) and splits the attention."""
    aten = torch.ops.aten
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.softmax.int or len(node.args) < 2:
            continue
        wide = node.args[0]
        x = _float_cast(wide, None, torch.float32)
        narrow = x.meta["val"].dtype if x is not None else None
        if narrow not in _NARROW_FLOATS or len(wide.users) != 1 or not node.users:
            continue
        if not all(_float_cast(user, torch.float32, narrow) is node for user in node.users):
            continue
        with gm.graph.inserting_before(node):
            softmax = gm.graph.call_function(aten.softmax.int, (x, node.args[1]))
        softmax.meta["val"] = next(iter(node.users)).meta["val"]
        for user in list(node.users):
            user.replace_all_uses_with(softmax)
            gm.graph.erase_node(user)
        gm.graph.erase_node(node)
        gm.graph.erase_node(wide)
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()


def _repeats_as_expands(gm: fx.GraphModule) -> None:
    """Write ``x.repeat_interleave(r, dim=d)`` (a whole-number ``r``; Llama's ``repeat_kv`` in some
    models) as the view it equals: ``x.unsqueeze(d + 1).expand(…, r, …).reshape(…, x.shape[d] · r, …)``,
    which the lowering takes (an expand that element-wise consumers read through, grouped-query heads
    that attention folds into rows) instead of leaving the copy in PyTorch and splitting there."""
    aten = torch.ops.aten
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target != aten.repeat_interleave.self_int:
            continue
        x, repeats = node.args[0], node.args[1]
        dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim")
        if dim is None or not isinstance(x, fx.Node) or not isinstance(repeats, int):
            continue  # no dim: it flattens first; a tensor of counts: not a view
        val = x.meta["val"]
        dim = dim % val.dim()
        expanded = [*val.shape[:dim + 1], repeats, *val.shape[dim + 1:]]
        shape = [*val.shape[:dim], val.shape[dim] * repeats, *val.shape[dim + 1:]]
        with gm.graph.inserting_before(node):
            unsqueezed = gm.graph.call_function(aten.unsqueeze.default, (x, dim + 1))
            unsqueezed.meta["val"] = val.unsqueeze(dim + 1)
            expand = gm.graph.call_function(aten.expand.default, (unsqueezed, expanded))
            expand.meta["val"] = unsqueezed.meta["val"].expand(expanded)
            reshaped = gm.graph.call_function(aten.reshape.default, (expand, shape))
            reshaped.meta["val"] = expand.meta["val"].reshape(shape)
            # contiguous, as repeat_interleave's result is: ops after it may view it (einsum's
            # decomposition does), and the reshape of a size-1 dim's expand is a view of stride 0
            copied = gm.graph.call_function(aten.clone.default, (reshaped,),
                                            {"memory_format": torch.contiguous_format})
            copied.meta["val"] = reshaped.meta["val"].clone(memory_format=torch.contiguous_format)
        node.replace_all_uses_with(copied)
        gm.graph.erase_node(node)
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()


CAUSAL_MASK = "_causal_mask_"  # the buffers that stand for is_causal=True
# node meta of a tensor whose values an input pattern names (mirage.mugraph.patterns)
PATTERN = "mirage_pattern"
# node meta of a grouped-query attention's causal mask, repeated for each query head of a key head
# (the rows the lowering folds them into): a buffer the lowering reads where it cannot broadcast
GROUPED_MASK = "mirage_grouped_mask"


def _explicit_causal_masks(gm: fx.GraphModule) -> None:
    """Give each ``scaled_dot_product_attention(..., is_causal=True)`` its mask as a tensor: an
    additive ``(queries, keys)`` buffer of 0 and −inf (query i sees keys 0..i, PyTorch's alignment),
    built once here, so that the search sees the masked form. Where such a node still runs in
    PyTorch, :func:`restore_causal` gives it back its flag (PyTorch's causal kernels skip the hidden
    keys; with the mask as a tensor it would take a slower kernel)."""
    from mirage.frontend.lowering import params

    sdpa = torch.ops.aten.scaled_dot_product_attention.default
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not sdpa:
            continue
        p = params(node)
        if not p.get("is_causal") or p.get("attn_mask") is not None:
            continue
        query, key = p["query"].meta["val"], p["key"].meta["val"]
        queries, keys = int(query.shape[-2]), int(key.shape[-2])
        pattern = patterns.causal(queries)
        mask = patterns.values(pattern, (queries, keys), query.dtype, query.device)
        name = f"{CAUSAL_MASK}{queries}x{keys}"
        attribute = _buffer(gm, node, name, mask, pattern)
        group = int(query.shape[-3]) // int(key.shape[-3]) if query.dim() >= 3 and key.dim() >= 3 else 1
        if p.get("enable_gqa") and group > 1:  # the lowering folds a key head's query heads into its rows
            grouped = mask.repeat(group, 1)
            node.meta[GROUPED_MASK] = _buffer(gm, node, f"{name}_grouped{group}", grouped, pattern)
        node.args = (p["query"], p["key"], p["value"])
        node.kwargs = {"attn_mask": attribute, "dropout_p": p["dropout_p"], "is_causal": False,
                       "scale": p.get("scale"), "enable_gqa": p.get("enable_gqa", False)}
    gm.recompile()


def _additive_bool_masks(gm: fx.GraphModule) -> None:
    """Give each ``scaled_dot_product_attention`` with a boolean ``attn_mask`` (True: the key takes
    part) the additive mask of the same meaning, 0 and −inf in the query's dtype, computed in PyTorch
    before it (:func:`fill_masks.additive_mask`), so that the attention is the masked form the search
    takes."""
    from mirage.frontend.lowering import params

    sdpa = torch.ops.aten.scaled_dot_product_attention.default
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not sdpa:
            continue
        p = params(node)
        mask = p.get("attn_mask")
        value = mask.meta.get("val") if isinstance(mask, fx.Node) else None
        if not isinstance(value, torch.Tensor) or value.dtype is not torch.bool:
            continue
        dtype = p["query"].meta["val"].dtype
        with gm.graph.inserting_before(node):
            additive = gm.graph.call_function(fill_masks.additive_mask, (mask, dtype))
        with getattr(value, "fake_mode", None) or contextlib.nullcontext():
            additive.meta["val"] = torch.where(value, 0.0, float("-inf")).to(dtype)
        node.args = (p["query"], p["key"], p["value"])
        node.kwargs = {"attn_mask": additive, "dropout_p": p.get("dropout_p", 0.0), "is_causal": False,
                       "scale": p.get("scale"), "enable_gqa": p.get("enable_gqa", False)}
    gm.recompile()


def _buffer(gm: fx.GraphModule, node: fx.Node, name: str, value: torch.Tensor, pattern: str) -> fx.Node:
    """A get_attr node before ``node`` of buffer ``name`` (registered as ``value`` once), whose values
    ``pattern`` names (node meta ``PATTERN``: the lowering's kernel inputs promise them)."""
    if not hasattr(gm, name):
        gm.register_buffer(name, value)
    with gm.graph.inserting_before(node):
        attribute = gm.graph.get_attr(name)
    attribute.meta["val"] = value
    attribute.meta[PATTERN] = pattern
    return attribute


def restore_causal(graph: fx.Graph) -> None:
    """Undo :func:`_explicit_causal_masks` on the attention nodes of ``graph`` that run in PyTorch:
    ``is_causal=True`` again, the mask buffer read no more."""
    sdpa = torch.ops.aten.scaled_dot_product_attention.default
    for node in list(graph.nodes):
        mask = node.kwargs.get("attn_mask") if node.op == "call_function" and node.target is sdpa else None
        if isinstance(mask, fx.Node) and mask.op == "get_attr" and str(mask.target).startswith(CAUSAL_MASK):
            node.kwargs = {**node.kwargs, "attn_mask": None, "is_causal": True}
    for node in list(graph.nodes):  # the masks (and grouped masks) no subprogram reads
        if node.op == "get_attr" and str(node.target).startswith(CAUSAL_MASK) and not node.users:
            graph.erase_node(node)


_ATEN = torch.ops.aten
_SCALAR_OPERAND = {_ATEN.add.Tensor, _ATEN.sub.Tensor, _ATEN.mul.Tensor, _ATEN.div.Tensor}
_COMMUTATIVE = {_ATEN.add.Tensor, _ATEN.mul.Tensor}


# 0-d constants (the position of the number among their arguments): torch.full([], c), and
# torch.scalar_tensor(c), which PyTorch's cosine_similarity decomposition clamps its norms with
_SCALAR_SOURCES = {_ATEN.full.default: 1, _ATEN.scalar_tensor.default: 0}
# a clamp whose bound is a 0-d tensor, and the clamp by a number it then is
_TENSOR_CLAMPS = {_ATEN.clamp_min.Tensor: _ATEN.clamp_min.default,
                  _ATEN.clamp_max.Tensor: _ATEN.clamp_max.default}


def _scalar_fulls(gm: fx.GraphModule) -> None:
    """Write a 0-d ``torch.full([], c)`` or ``torch.scalar_tensor(c)`` operand of an element-wise add,
    subtract, multiply or divide of a floating tensor, or the bound of its ``clamp_min`` or
    ``clamp_max``, as the number it holds (rounded to its dtype, as the op reads it): GPT-2 divides its
    scores by ``torch.full([], sqrt(d))``, which otherwise stays a PyTorch op before the attention."""
    for full in list(gm.graph.nodes):
        value = full.meta.get("val") if full.op == "call_function" else None
        position = _SCALAR_SOURCES.get(full.target) if full.op == "call_function" else None
        if (position is None or not isinstance(value, torch.Tensor) or value.dim()
                or not value.is_floating_point() or not isinstance(full.args[position], (int, float))):
            continue
        number = float(torch.tensor(float(full.args[position]), dtype=value.dtype))
        for user in list(full.users):
            clamp = _TENSOR_CLAMPS.get(user.target) if user.op == "call_function" else None
            scalar_operand = user.op == "call_function" and user.target in _SCALAR_OPERAND
            if not (scalar_operand or clamp is not None) or user.kwargs:
                continue
            a, b = user.args[:2]
            commutes = user.target in _COMMUTATIVE
            other = a if b is full else b if a is full and commutes else None
            other_value = other.meta.get("val") if isinstance(other, fx.Node) else None
            if (not isinstance(other_value, torch.Tensor) or not other_value.dim()
                    or not other_value.is_floating_point() or (a is full and b is full)):
                continue  # a 0-d or integer operand would take the full's dtype in promotion
            if clamp is not None:
                user.target = clamp
            user.args = (other, number, *user.args[2:])
        if not full.users:
            gm.graph.erase_node(full)
    gm.recompile()


def _drop_value_asserts(gm: fx.GraphModule) -> None:
    """Drop the dtype asserts torch.export puts on the operand of each ``.to(dtype)`` when that
    operand is computed: a subprogram would have to return the value only for the check (and it
    holds the value in its own dtype).  Those on inputs stay."""
    assert_metadata = torch.ops.aten._assert_tensor_metadata.default
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is assert_metadata and not node.users:
            operand = node.args[0] if node.args else None
            if isinstance(operand, fx.Node) and operand.op != "placeholder":
                gm.graph.erase_node(node)
    gm.recompile()
