"""Attention with an additive mask at a prefill shape: hand-built µGraphs of the forms the search
finds (one kernel of 16- or 64-row blocks looping over the keys, the mask tiled beside the scores),
in their build forms, against PyTorch: the softmax written out, SDPA with the mask as a tensor, and
SDPA's own causal kernel (``is_causal=True``).

The masks: a random bias (ALiBi- or T5-style) and causal attention's 0 / −inf, the latter also as an
input that names the causal pattern, which the chain computes (``computed_``; also with the row blocks
launched in grid order, ``_in_order``, instead of the longest first).  ``--size`` and ``--masks``
choose the shape and the masks.  Each member also
runs with the chain's skip of the sub-steps a mask hides whole (``_skip``; off by default).  Each build is
checked against float64 PyTorch on the same inputs before it is timed.  Prints one line per
measurement and writes masked_attention_<date>.json into ``--out`` (default benchmarks/results)."""

from __future__ import annotations

import argparse
import dataclasses

import torch
import torch.nn.functional as F

from benchmarks.stream_floor import write_record
from mirage import MirageError
from mirage.codegen.lower_program import generate_cuda_program
from mirage.codegen.profile import device_facts, time_graph
from mirage.codegen.runtime import build_many
from mirage.optimizer import OptimizerOptions
from tests.unit.verifier.verifier_graphs import causal_mask, masked_attention

HEADS, QUERIES, KEYS, DIM = 12, 512, 512, 64
WARPGROUP = OptimizerOptions(warpgroup_softmax=True, tma_copies=True)
# (label, graph arguments, options)
MEMBERS = [(f"rows64_keys{keys}_warpgroup_stages{stages}", dict(rows=64, key_tile=keys),
            dataclasses.replace(WARPGROUP, stages=stages)) for keys in (64, 128) for stages in (2, 3, 4)]
MEMBERS += [(f"rows16_keys{keys}_warp_stages{stages}", dict(rows=16, key_tile=keys),
             OptimizerOptions(stages=stages)) for keys in (64, 128) for stages in (2, 3)]
SKIP_HIDDEN = "#define MIRAGE_SOFTMAX_SKIP_HIDDEN 1\n"  # the chain skips the sub-steps a mask hides whole


def _builds(size: tuple[int, int, int, int], pattern: str = "", suffixes: tuple[str, ...] = ("", "_skip")
            ) -> list[tuple[str, object]]:
    """(label, program or the error its generation or compilation raised) of each member at ``size``
    (heads, queries, keys, dim), in each form of ``suffixes``: as generated (""), with the skip of
    hidden sub-steps ("_skip"), or with the row blocks launched in grid order ("_in_order": a
    computed causal mask's heavy-first launch off). ``pattern``: the mask input's (a causal one is
    computed by the chain instead of read)."""
    labels, sources = [], []
    for suffix in suffixes:
        for label, shape, options in MEMBERS:
            labels.append(label + suffix)
            options = dataclasses.replace(options, heavy_first=suffix != "_in_order")
            try:
                graph = masked_attention(*size, form="whole", **shape, pattern=pattern)
                source = generate_cuda_program(graph, None, options=options)
                sources.append(dataclasses.replace(source, code=SKIP_HIDDEN + source.code)
                               if suffix == "_skip" else source)
            except MirageError as error:
                sources.append(error)
    programs = iter(build_many([s for s in sources if not isinstance(s, Exception)]))
    built = [s if isinstance(s, Exception) else next(programs) for s in sources]
    return list(zip(labels, built, strict=True))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results", help="folder of the JSON record")
    parser.add_argument("--size", default=f"{HEADS},{QUERIES},{KEYS},{DIM}", help="heads,queries,keys,dim")
    parser.add_argument("--masks", default="bias,causal", help="of bias, causal (comma-separated)")
    args = parser.parse_args(argv)
    size = tuple(int(x) for x in args.size.split(","))
    heads, queries, keys, dim = size
    if dim != 64:
        parser.error("the members scale the scores by 1/8: SDPA's scale at head dim 64 only")
    facts = device_facts()
    torch.manual_seed(0)
    q, v = (torch.randn(heads, n, dim, device="cuda").half() for n in (queries, keys))
    k = torch.randn(heads, keys, dim, device="cuda").half()
    kt = k.transpose(-1, -2).contiguous()  # the µGraphs read K as (heads, dim, keys)
    q4, k4, v4 = (x.unsqueeze(0) for x in (q, k, v))  # SDPA's 4-D form (3-D takes its slow math path)
    masks = {"bias": lambda: torch.randn(1, queries, keys, device="cuda").half(),
             "causal": lambda: torch.from_numpy(causal_mask(queries, keys)).cuda().half()}
    masks = {name: masks[name]() for name in args.masks.split(",")}
    rows = []

    def record(row):
        rows.append(row)
        print(row, flush=True)

    scale = 0.125  # the µGraphs' (masked_attention), SDPA's at head dim 64
    for name, mask in masks.items():
        scores = q.double() @ k.double().transpose(-1, -2) * scale + mask.double()
        truth = torch.softmax(scores, -1) @ v.double()
        baselines = {"eager": lambda m=mask: torch.softmax(q @ k.transpose(-1, -2) * scale + m, -1) @ v,
                     "sdpa_mask": lambda m=mask: F.scaled_dot_product_attention(q4, k4, v4, attn_mask=m)}
        if name == "causal":
            baselines["sdpa_causal"] = lambda: F.scaled_dot_product_attention(q4, k4, v4, is_causal=True)
        for label, fn in baselines.items():
            record({"mask": name, "member": label, "us": time_graph(fn, replays=100).median_us})
        # the causal mask also as an input that names its pattern: computed by the chain, not read
        forms = [("", "", ("", "_skip"))]
        if name == "causal":
            forms.append(("computed_", f"causal:{queries}", ("", "_skip", "_in_order")))
        for prefix, pattern, suffixes in forms:
            for label, program in _builds(size, pattern, suffixes):
                row = {"mask": name, "member": prefix + label}
                if isinstance(program, Exception):
                    row["error"] = f"{type(program).__name__}: {str(program)[:200]}"
                else:
                    (got,) = program(q, kt, v, mask)
                    row["max_error"] = (got.double() - truth).abs().max().item()
                    if row["max_error"] < 1e-2:
                        timing = time_graph(lambda p=program, m=mask: p(q, kt, v, m), replays=100)
                        row["us"] = timing.median_us
                record(row)
    write_record(args.out, "masked_attention", facts, rows)


if __name__ == "__main__":
    main()
