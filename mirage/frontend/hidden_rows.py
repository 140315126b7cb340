"""Query rows whose mask hides every key: PyTorch's ``scaled_dot_product_attention`` gives them 0 (its
"safe" softmax, since PyTorch 2.5, with a boolean or an additive mask alike), while
``softmax(scores + mask)``, by ``torch.softmax`` and by the generated kernels alike, gives 0 / 0 = NaN.
Capture puts :func:`zero_hidden_rows` after each masked attention whose mask may hide a whole row
(:func:`safe_attention_rows`), so the program keeps PyTorch's answer whichever side runs the attention.

It costs nothing where no row is hidden: a mask seen again unchanged (the same tensor, the same
version counter) is checked once, on its second call (a mask made anew for every call is never
checked: the rows are then zeroed by one element-wise ``where``, with no wait on the GPU), and a
buffer mask that hides no row at capture gets no step at all.

>>> q = k = v = torch.ones(1, 1, 2, 4)
>>> mask = torch.tensor([[True, True], [False, False]])  # the second query sees no key
>>> out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
>>> torch.equal(zero_hidden_rows(torch.full_like(out, float("nan")), mask)[0, 0, 1], out[0, 0, 1])
True
"""

from __future__ import annotations

import weakref

import torch
import torch.fx as fx

from mirage.frontend import fill_masks, graphs

# masks seen, by id: (a weak reference, its version, its hidden rows: None until checked, False when none)
_SEEN: dict[int, tuple[weakref.ref, int, torch.Tensor | bool | None]] = {}


def hidden_rows(mask: torch.Tensor) -> torch.Tensor:
    """True for each query row whose keys ``mask`` hides all (boolean: True where a key takes part;
    additive: −inf hides), keeping the mask's rank with one key: broadcasts over the attention's output."""
    hides = ~mask if mask.dtype is torch.bool else torch.isneginf(mask)
    return hides.all(-1, keepdim=True)


def zero_hidden_rows(out: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``out``, an attention's result under ``mask``, with the rows whose keys the mask hides all set
    to 0, as PyTorch's attention gives them."""
    try:
        version = mask._version
    except RuntimeError:  # an inference tensor keeps no version counter: zero every time
        version = None
    if version is None or graphs.capturing((mask,)) or torch.compiler.is_compiling():
        return torch.where(hidden_rows(mask), 0.0, out)
    entry = _SEEN.get(id(mask))
    if entry is None or entry[0]() is not mask or entry[1] != version:  # first seen as it is
        for key in [k for k, e in _SEEN.items() if e[0]() is None]:  # masks freed since
            del _SEEN[key]
        _SEEN[id(mask)] = (weakref.ref(mask), version, None)
        return torch.where(hidden_rows(mask), 0.0, out)
    rows = entry[2]
    if rows is None:  # seen again unchanged: check it once
        rows = hidden_rows(mask)
        rows = rows if bool(rows.any()) else False
        _SEEN[id(mask)] = (entry[0], version, rows)
    return out if rows is False else torch.where(rows, 0.0, out)


def safe_attention_rows(gm: fx.GraphModule) -> None:
    """Put :func:`zero_hidden_rows` after each ``scaled_dot_product_attention`` with an ``attn_mask``,
    unless the mask is computed from buffers alone (``fill_masks.buffer_value``) and hides no whole row
    at capture (a causal, windowed or padding mask of non-empty prompts; a buffer changed in place later
    to hide one is not seen)."""
    sdpa = torch.ops.aten.scaled_dot_product_attention.default
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not sdpa:
            continue
        mask = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
        if not isinstance(mask, fx.Node):
            continue
        if mask.op == "call_function" and mask.target is fill_masks.additive_mask:
            mask = mask.args[0]  # SDPA's boolean mask (True: the key takes part), which hides the same rows
        value = fill_masks.buffer_value(gm, mask)
        if value is not None and not bool(hidden_rows(value).any()):
            continue
        with gm.graph.inserting_after(node):
            safe = gm.graph.call_function(zero_hidden_rows, (node, mask))
        safe.meta["val"] = node.meta["val"]
        node.replace_all_uses_with(safe, delete_user_cb=lambda user, safe=safe: user is not safe)
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()
