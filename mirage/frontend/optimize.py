"""Choosing the µGraph that runs each subprogram: the search, and its on-disk cache.

The cache key is the content hash of the reference kernel graph (input names stripped, so that two
programs that differ only in variable names share an entry), the search settings and the library
version.  A cached entry is reused without searching, once its µGraph passes the same float check
as a fresh search result (an entry that fails it is searched again).  When ``mirage.generator``
offers no search (or ``search=False``), the reference graph itself is the chosen µGraph: a marked
fallback (``source == "reference"``) that is correct everywhere, only not faster, and is never
cached; ``search=False`` neither reads nor writes the cache.  A cache that cannot be written (a
read-only folder) costs one warning, never the search result.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mirage.config import warn_corrupt, warn_unwritable
from mirage.mugraph.graph import BlockGraph, KernelGraph, KernelInput, Node
from mirage.mugraph.ops import Op
from mirage.mugraph.serialize import content_hash, dumps, loads
from mirage.optimizer.softmax import StableExps, unstable_exps

logger = logging.getLogger("mirage.frontend")

CACHE_FORMAT = "mirage.search-cache"
CACHE_VERSION = 1


@dataclass(frozen=True)
class SearchSettings:
    """What the search is asked to do; part of the cache key."""

    config: str | None = None
    time_limit_s: float = 30.0
    overrides: tuple[tuple[str, str], ...] = ()  # (name, JSON of the value), sorted
    max_results: int | None = None  # stop after this many verified µGraphs
    candidates: tuple[str, ...] = ()  # content hashes of the user's candidate µGraphs, sorted

    def to_dict(self) -> dict:
        return {"config": self.config, "time_limit_s": self.time_limit_s, "overrides": list(self.overrides),
                "max_results": self.max_results, "candidates": list(self.candidates)}


@dataclass(frozen=True)
class Choice:
    """The µGraph chosen for one subprogram, and where it came from."""

    graph: KernelGraph
    source: str  # "search", "split rows", "row-wise" (generated), "candidate", "cache", "reference"
    key: str
    detail: str
    seconds: float = 0.0
    build: dict | None = None  # how to build it, where profiling chose (codegen.runtime.BuildChoice)


def auto_config(graph: KernelGraph) -> str:
    """The named search space that suits a subprogram: ``attention`` when exponentials reach a matrix
    product (the probabilities of a softmax times V), ``lora`` when it adds two matrix products,
    ``mlp`` otherwise (a softmax that ends the subprogram among them: the attention space's input
    maps cannot give a block whole rows of a 2-D tensor, which its one-kernel µGraphs need)."""
    after_exp: set[int] = set()
    for i, node in enumerate(graph.nodes):
        operands = {r.node for r in node.inputs}
        if node.op is Op.MATMUL and operands & after_exp:
            return "attention"
        if node.op is Op.EXP or operands & after_exp:
            after_exp.add(i)
    for node in graph.nodes:
        if node.op is Op.ADD and all(graph.nodes[r.node].op is Op.MATMUL for r in node.inputs):
            return "lora"
    return "mlp"


# the block-op budget a subprogram may raise the search's to (13: a matmul and a nine-op epilogue)
MOST_BLOCK_OPS = 13
_BLOCK_BUDGET_NAMES = ("max_block_ops", "max_num_threadblock_graph_op", "block_op_budget")
_SHARED_MEMORY_NAMES = ("shared_memory_bytes",)


def one_kernel_block_ops(graph: KernelGraph) -> int:
    """Block ops that ``graph`` takes as one kernel (Mirage's count: output savers not counted): an
    input iterator per input, an op per op, an accumulator per matrix product, one per output that no
    product reaches (a block graph's outputs come from accumulators), and one per input read after a
    product's accumulator (a bias: values before and after an accumulator do not mix)."""
    after = set()  # nodes past a matrix product's accumulator
    read_after = set()  # inputs read by such nodes
    for i, node in enumerate(graph.nodes):
        operands = {r.node for r in node.inputs}
        if node.op is Op.MATMUL or operands & after:
            after.add(i)
            if node.op is not Op.MATMUL:
                read_after |= {j for j in operands if graph.nodes[j].op is Op.INPUT}
    outputs = sum(r.node not in after for r in graph.outputs)
    matmuls = sum(node.op is Op.MATMUL for node in graph.nodes)
    return len(graph.nodes) + matmuls + outputs + len(read_after)


def with_block_budget(reference: KernelGraph, settings: SearchSettings) -> SearchSettings:
    """``settings`` with the block-op budget raised, up to :data:`MOST_BLOCK_OPS`, to what ``reference``
    takes as one kernel, where that is over the ``mlp`` space's budget and the caller set none: a
    matrix product with a long element-wise epilogue then has its one-kernel µGraph in the space.
    The search deepens block graphs one op at a time, so the shallower µGraphs come first as before.
    The attention and LoRA spaces keep their budgets (their one-kernel forms are not what they seek)."""
    from mirage.generator.space import CONFIGS

    if settings.config != "mlp" or any(name in _BLOCK_BUDGET_NAMES for name, _ in settings.overrides):
        return settings
    default = CONFIGS["mlp"].max_block_ops
    wanted = min(one_kernel_block_ops(reference), MOST_BLOCK_OPS)
    if wanted <= default:
        return settings
    overrides = tuple(sorted((*settings.overrides, ("max_block_ops", json.dumps(wanted)))))
    return dataclasses.replace(settings, overrides=overrides)


_KERNEL_BUDGET_NAMES = ("max_kernel_ops", "kernel_op_budget", "max_num_kernel_graph_op")


def with_kernel_budget(reference: KernelGraph, settings: SearchSettings) -> SearchSettings:
    """``settings`` with the kernel-op budget raised to the reference's inputs plus one op (its
    one-kernel form), where the space's budget (which counts inputs, as Mirage's does: 5, two ops on
    three inputs) leaves none and the caller set none: a gated product with biases has five inputs,
    and at 5 its search had no room for a single graph-defined op."""
    from mirage.generator.space import CONFIGS

    if settings.config not in CONFIGS or any(name in _KERNEL_BUDGET_NAMES for name, _ in settings.overrides):
        return settings
    wanted = sum(n.op is Op.INPUT for n in reference.nodes) + 1
    if wanted <= CONFIGS[settings.config].max_kernel_ops:
        return settings
    overrides = tuple(sorted((*settings.overrides, ("max_kernel_ops", json.dumps(wanted)))))
    return dataclasses.replace(settings, overrides=overrides)


_LAYOUT_NAMES = ("griddims", "grid_dims", "grid_spans", "imap_combos", "imaps", "fmap_combos", "fmaps",
                 "franges", "omaps")


def with_attention_layout(reference: KernelGraph, settings: SearchSettings) -> SearchSettings:
    """``settings`` of the ``attention`` space with FlashAttention's and FlashDecoding's headers for
    ``reference``'s shapes and the block budget of the one-kernel form
    (:mod:`mirage.generator.flash_decoding`), unless the caller set grids or maps: from scratch, the
    space's own headers verify nothing in minutes for an attention of unseen shapes."""
    from mirage.generator import flash_decoding

    if settings.config != "attention" or any(name in _LAYOUT_NAMES for name, _ in settings.overrides):
        return settings
    layout = flash_decoding.overrides(reference)
    if layout is None:
        return settings
    if any(name in _BLOCK_BUDGET_NAMES for name, _ in settings.overrides):
        layout.pop("max_block_ops", None)  # the caller's budget stands (it may leave out the one-kernel form)
    if any(name in _KERNEL_BUDGET_NAMES for name, _ in settings.overrides):
        layout.pop("max_kernel_ops", None)
    if any(name in _SHARED_MEMORY_NAMES for name, _ in settings.overrides):
        layout.pop("shared_memory_bytes", None)
    overrides = tuple(sorted((*settings.overrides, *((k, json.dumps(v)) for k, v in layout.items()))))
    return dataclasses.replace(settings, overrides=overrides)


def with_row_tiles(reference: KernelGraph, settings: SearchSettings) -> SearchSettings:
    """``settings`` of the ``mlp`` space with 2-D tiles over the rows and columns of a matrix product
    with many rows (a projection at prefill: :mod:`mirage.generator.row_tiles`) beside the space's own
    grids and maps, unless the caller set grids or maps."""
    from mirage.generator import row_tiles
    from mirage.generator.space import SearchSpace

    if settings.config != "mlp" or any(name in _LAYOUT_NAMES for name, _ in settings.overrides):
        return settings
    layout = row_tiles.overrides(reference, SearchSpace.named("mlp"))
    if layout is None:
        return settings
    overrides = tuple(sorted((*settings.overrides, *((k, json.dumps(v)) for k, v in layout.items()))))
    return dataclasses.replace(settings, overrides=overrides)


# tile lengths along the split dim for element-wise subprograms: the space's own (8–256) and finer
ELEMENT_TILES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def with_element_grids(reference: KernelGraph, settings: SearchSettings) -> SearchSettings:
    """``settings`` of the ``mlp`` space with finer 1-D grids for an element-wise subprogram (no matrix
    product, no reduction), unless the caller set grids or maps: the space's grids split a dim into
    tiles of at least 8, and for a (32, 256, 64) product with (1, 256, 64) tables (rotary embedding)
    every such tiling holds more than the shared memory the space allows, so nothing was found."""
    from mirage.generator.space import CONFIGS
    from mirage.mugraph.ops import ELEMENTWISE

    if settings.config != "mlp" or any(name in _LAYOUT_NAMES for name, _ in settings.overrides):
        return settings
    if not all(n.op is Op.INPUT or n.op in ELEMENTWISE for n in reference.nodes):
        return settings
    space = CONFIGS["mlp"]
    shape = reference.output_types[0].shape
    grids = {(d // x, 1, 1) for d in shape for x in ELEMENT_TILES if d % x == 0}
    grids = {g for g in grids if space.min_grid_blocks <= g[0] <= space.max_grid_blocks}
    if len(shape) in (2, 3):  # a block per row (per leading index), as the space adds it: unfiltered
        grids.add((shape[0], 1, 1))
    grids = sorted(grids)
    overrides = tuple(sorted((*settings.overrides, ("grid_dims", json.dumps(grids)))))
    return dataclasses.replace(settings, overrides=overrides)


def strip_names(graph: KernelGraph) -> KernelGraph:
    """``graph`` without its names (its inputs' patterns stay: the code generated for it depends on them)."""
    nodes = tuple(dataclasses.replace(n, attrs=KernelInput("", n.attrs.pattern))
                  if isinstance(n.attrs, KernelInput) else n for n in graph.nodes)
    return KernelGraph(nodes, graph.outputs, "")


def cache_key(reference: KernelGraph, settings: SearchSettings) -> str:
    from mirage import __version__

    document = {"graph": content_hash(strip_names(reference)), "settings": settings.to_dict(),
                "version": __version__, "spaces": _spaces_hash()}
    templates = split_row_candidates(reference)
    if templates:  # what the choice is made among besides the search's (a key of its own)
        document["split_rows"] = [content_hash(g) for g in templates]
    chains = rowwise_candidates(reference)
    if chains:
        document["rowwise"] = [content_hash(g) for g in chains]
    text = json.dumps(document, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def split_row_candidates(reference: KernelGraph) -> list[KernelGraph]:
    """Split-row µGraphs for a long-row log_softmax, logsumexp or softmax
    (:mod:`mirage.generator.split_rows`) or norm (:mod:`mirage.generator.split_norms`), which the
    search's spaces cannot hold; none where the generator is not installed."""
    try:
        from mirage.generator import split_norms, split_rows
    except ImportError:
        return []
    return split_rows.candidates(reference) + split_norms.candidates(reference)


def _beyond_the_space(reference: KernelGraph, settings: SearchSettings) -> str:
    """Why the search cannot give ``reference``'s one-kernel form ("" where it can): the block ops of
    that form past the space's budget (raised by :func:`with_block_budget` to
    :data:`MOST_BLOCK_OPS` at most). Its other forms, several kernels, move more memory than the
    one-kernel row-wise µGraph (:func:`rowwise_candidates`), so the search is skipped there: AdamW's
    step searched its whole budget in vain."""
    from mirage.generator.space import CONFIGS

    budget = next((json.loads(v) for name, v in settings.overrides if name in _BLOCK_BUDGET_NAMES), None)
    if budget is None and settings.config in CONFIGS:
        budget = CONFIGS[settings.config].max_block_ops
    needed = one_kernel_block_ops(reference)
    if budget is None or needed <= budget:
        return ""
    return (f"the one-kernel form takes {needed} block ops, past the search space's {budget}, and the "
            "row-wise µGraph is that form")


def rowwise_candidates(reference: KernelGraph) -> list[KernelGraph]:
    """One-kernel µGraphs for a row-wise reference of any length (:mod:`mirage.generator.rowwise`:
    AdamW's step, two log_softmaxes and their difference, beyond what the search's spaces hold); none
    where the generator is not installed."""
    try:
        from mirage.generator import rowwise
    except ImportError:
        return []
    return rowwise.candidates(reference)


@functools.cache
def _spaces_hash() -> str:
    """The named search spaces' defaults, in the key: an entry holds what a search of them found, so a
    change of a space (uneven grids added to every space's grids, say) searches again."""
    try:
        from mirage.generator.space import CONFIGS
    except ImportError:  # no search here: the entries were made elsewhere
        return ""
    text = "".join(CONFIGS[name].content_hash() for name in sorted(CONFIGS))
    return hashlib.sha256(text.encode()).hexdigest()


def _entry_path(cache_dir: Path, key: str) -> Path:
    return cache_dir / f"{key}.json"


_KEY_NAME = re.compile(r"[0-9a-f]{64}")  # a frontend entry: <key>.json (sha256 hex)
_RESULT_DIR = re.compile(r"[0-9a-f]{32}")  # the generator's result cache: <key>/result.json, stats.json
_RESULT_FILES = ("result.json", "stats.json")


def _is_entry(document: object) -> bool:
    return isinstance(document, dict) and document.get("format") == CACHE_FORMAT


def read_entry(cache_dir: Path, key: str) -> dict | None:
    path = _entry_path(cache_dir, key)
    if not path.is_file():
        return None
    try:
        entry = json.loads(path.read_text())
        if not isinstance(entry, dict):
            raise ValueError(f"a JSON {type(entry).__name__}, not an entry")
        if entry.get("format") != CACHE_FORMAT or entry.get("version") != CACHE_VERSION:
            raise ValueError("unknown format")
        if not isinstance(entry.get("chosen"), str):
            raise ValueError("no chosen µGraph")
        if entry.get("build") is not None and not isinstance(entry["build"], dict):
            raise ValueError("'build' is not an object")
        entry["graph"] = loads(entry["chosen"])
        if not isinstance(entry["graph"], KernelGraph):
            raise ValueError("'chosen' is not a kernel graph")
        entry["source"] = str(entry.get("source", "?"))
        return entry
    except Exception as error:  # noqa: BLE001 - a malformed entry is searched again, never an error
        reason = error if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"
        warn_corrupt(path, f"unreadable search-cache entry ({reason})")
        return None


def write_entry(cache_dir: Path, key: str, reference: KernelGraph, choice: Choice,
                settings: SearchSettings) -> Path:
    cache_dir.mkdir(parents=True, exist_ok=True)
    entry = {
        "format": CACHE_FORMAT, "version": CACHE_VERSION, "key": key, "name": reference.name,
        "reference": dumps(reference), "chosen": dumps(choice.graph), "source": choice.source,
        "detail": choice.detail, "search_seconds": round(choice.seconds, 3), "build": choice.build,
        "settings": settings.to_dict(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    path = _entry_path(cache_dir, key)
    scratch = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        scratch.write_text(json.dumps(entry, indent=1))
        os.replace(scratch, path)
    except BaseException:
        scratch.unlink(missing_ok=True)
        raise
    return path


def _write_entry_or_warn(cache_dir: Path, key: str, reference: KernelGraph, choice: Choice,
                         settings: SearchSettings) -> None:
    """Keep ``choice`` in the cache; a failed write warns (once per call) and loses only the entry."""
    try:
        write_entry(cache_dir, key, reference, choice, settings)
    except OSError as error:
        warn_unwritable(_entry_path(cache_dir, key), error)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def list_entries(cache_dir: Path) -> list[dict]:
    """Summaries of the cache entries (newest first); unreadable entry files are listed as such and
    JSON files that are not entries (nor named like one) are left out."""
    rows = []
    for path in sorted(cache_dir.glob("*.json")) if cache_dir.is_dir() else []:
        try:
            entry = json.loads(path.read_text())
            if not _is_entry(entry):
                if _KEY_NAME.fullmatch(path.stem):
                    raise ValueError("not an entry")
                continue  # someone else's file
            rows.append({"key": str(entry.get("key", path.stem)), "name": str(entry.get("name") or ""),
                         "source": str(entry.get("source")), "created": str(entry.get("created") or ""),
                         "detail": str(entry.get("detail") or ""), "bytes": _size(path)})
        except (OSError, ValueError):
            if not _KEY_NAME.fullmatch(path.stem):
                continue
            rows.append({"key": path.stem, "name": "", "source": "unreadable", "created": "", "detail": "",
                         "bytes": _size(path)})
    return sorted(rows, key=lambda r: r["created"], reverse=True)


def clear_entries(cache_dir: Path) -> int:
    """Remove the cache entries under ``cache_dir``: the frontend's ``<key>.json`` entries (by their
    format, or an unreadable file named like one) and the generator's finished searches
    (``<key>/result.json`` and ``stats.json``).  Other files are left alone.  Returns how many
    entries were removed."""
    count = 0
    if not cache_dir.is_dir():
        return 0
    for path in cache_dir.glob("*.json"):
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError):
            document = None
        if _is_entry(document) or (_KEY_NAME.fullmatch(path.stem) and not isinstance(document, dict)):
            path.unlink(missing_ok=True)
            count += 1
    for path in cache_dir.glob("*.tmp"):  # scratch files of interrupted writes: <key>.<pid>.tmp
        if _KEY_NAME.fullmatch(path.name.split(".")[0]):
            path.unlink(missing_ok=True)
    for directory in cache_dir.iterdir():
        if not (directory.is_dir() and _RESULT_DIR.fullmatch(directory.name)):
            continue
        names = {p.name for p in directory.iterdir()}
        known = {n for n in names
                 if n in _RESULT_FILES or (n.startswith(_RESULT_FILES) and n.endswith(".tmp"))}
        if "result.json" not in names or names - known:
            continue  # not (only) a finished search: leave it
        shutil.rmtree(directory, ignore_errors=True)
        count += 1
    return count


# ---- the search ------------------------------------------------------------------------------------


class SearchUnavailable(Exception):
    """mirage.generator has no search driver in this installation."""


def _with_override(settings: SearchSettings, name: str, value: Any) -> SearchSettings:
    """``settings`` with the generator setting ``name`` set to ``value`` (after the cache key is made)."""
    return dataclasses.replace(settings, overrides=tuple(sorted((*settings.overrides,
                                                                 (name, json.dumps(value))))))


def run_search(reference: KernelGraph, settings: SearchSettings,
               progress: bool = True) -> tuple[KernelGraph | None, str, list[KernelGraph], bool]:
    """Search µGraphs equivalent to ``reference``; returns the best verified one (or None), a note,
    every verified µGraph, and whether the search was interrupted (Ctrl-C: its result is partial)."""
    try:
        from mirage.generator import search
    except ImportError as error:
        raise SearchUnavailable(f"mirage.generator offers no search ({error})") from None
    from mirage.generator import Budget, StopReason

    kwargs: dict = {"progress": progress,
                    "budget": Budget(time_s=settings.time_limit_s, results=settings.max_results)}
    if any(n.op is Op.EXP for n in reference.nodes):  # verify none of what _drop_unstable discards
        kwargs["keep_when"] = StableExps.of(reference)
    kwargs.update((name, json.loads(value)) for name, value in settings.overrides)
    result = search(reference, settings.config, **kwargs)
    stop = getattr(result.stop_reason, "value", result.stop_reason)
    note = (f"{len(result.graphs)} verified µGraph(s) of {result.stats.verify_calls} checked in "
            f"{result.stats.states:,} states; search stopped: {stop}")
    interrupted = result.stop_reason is StopReason.INTERRUPTED
    return result.best, note, list(result.graphs), interrupted


def _drop_unstable(reference: KernelGraph, found: KernelGraph | None, note: str,
                   graphs: list[KernelGraph]) -> tuple[KernelGraph | None, str, list[KernelGraph]]:
    """The verified µGraphs without more unstable exps than the reference has (whose own exps the
    rewrite stabilises where PyTorch's softmax is stable): a searched µGraph must not turn a finite
    softmax of large logits into inf / inf."""
    if not graphs or not any(n.op is Op.EXP for n in reference.nodes):  # then no verified µGraph has one
        return found, note, graphs
    allowed = unstable_exps(reference)
    kept = [g for g in graphs if unstable_exps(g) <= allowed]
    if len(kept) == len(graphs):
        return found, note, graphs
    note = f"{note}; {len(graphs) - len(kept)} left out: exps the online-softmax rewrite cannot stabilise"
    return (found if any(found is g for g in kept) else (kept[0] if kept else None)), note, kept


FUSED_CHECK = 64  # the searched µGraphs whose attention kernels fused_first checks (about 0.05 s each)


def _is_attention(block: BlockGraph) -> bool:
    """Whether ``block`` has an exp of a product that feeds a product (``exp(Q·K …) · V``): the bodies
    the online-softmax chain serves, not an exp beside a product (a softmax before a projection)."""
    def product_among(nodes: set[int]) -> bool:
        return any(block.nodes[j].op is Op.MATMUL for j in nodes)

    return any(n.op is Op.EXP and product_among(block.upstream(i)) and product_among(block.downstream(i))
               for i, n in enumerate(block.nodes))


def op_by_op_attention(graph: KernelGraph) -> int:
    """How many of ``graph``'s graph-defined kernels are attention loop bodies (:func:`_is_attention`)
    that the optimizer leaves op by op, off the online-softmax chain: such a kernel runs several times
    slower than the chain (ViT's 50-row member 53.0 µs op by op, 14.2 on the chain; docs/performance.md
    §2). A graph the optimizer refuses counts as all of its nodes."""
    from mirage.optimizer import prepare

    attention = sum(1 for n in graph.nodes if isinstance(n.attrs, BlockGraph) and _is_attention(n.attrs))
    if not attention:
        return 0
    try:
        program = prepare(graph)
    except Exception:  # noqa: BLE001 - ranked last; building it would say what is wrong
        return len(graph.nodes)
    return max(0, attention - sum(1 for k in program.kernels if k.softmax_chain is not None))


def fused_first(reference: KernelGraph, found: KernelGraph | None, note: str, graphs: list[KernelGraph]
                ) -> tuple[KernelGraph | None, str, list[KernelGraph]]:
    """The search's µGraphs (``found``, the best by the cost model, first) with the first FUSED_CHECK
    reordered so that those with fewer op-by-op attention kernels (:func:`op_by_op_attention`) come
    first, each group in the cost model's order: the GPU times the first PROFILE_CANDIDATES, and
    without a GPU the first is kept. The cost model prices a loop body the same however it is lowered,
    and one-step loops come in forms the chain does not match (the division inside the loop)."""
    if found is None or not any(n.op is Op.EXP for n in reference.nodes):
        return found, note, graphs
    ordered = [found, *(g for g in graphs if g is not found)]
    head, rest = ordered[:FUSED_CHECK], ordered[FUSED_CHECK:]
    keys = [op_by_op_attention(g) for g in head]
    if keys == sorted(keys):
        return found, note, graphs
    moved = sum(1 for k in keys if k > min(keys))
    ranked = [head[i] for i in sorted(range(len(head)), key=keys.__getitem__)] + rest
    note = f"{note}; {moved} with attention kernels off the online-softmax chain ranked after the others"
    return ranked[0], note, ranked[1:]


PROFILE_CANDIDATES = 16  # verified µGraphs timed on the GPU per subprogram (best by the cost model first)


def profile_choice(reference: KernelGraph, candidates: list[KernelGraph]
                   ) -> tuple[KernelGraph, str, dict, float, frozenset[int] | None]:
    """Profile-guided selection on the current GPU: compile, time and float-check the candidates
    (mirage.codegen.select) and return the fastest that matches the reference, a note, how it was
    built (``BuildChoice.as_dict``: pipeline depth and launch mode), its time (µs a call) and the
    inputs (positions) its kernels read in place where they are declared as views (transposed, or
    through strides: the others it copies, which the guard charges to it)."""
    from mirage.codegen.select import select_fastest

    given = candidates[:PROFILE_CANDIDATES]
    renamed = [_rename(g, reference) for g in given]  # built with the reference's input patterns
    selection = select_fastest(reference, renamed, stages=(2, 3))
    best = selection.best
    built = best.variant.graph
    picked = next((g for g, r in zip(given, renamed, strict=True) if r is built), built)
    launch = ("on, one block per SM" if best.spread_blocks else "on") if best.dependent_launch else "off"
    cuda = getattr(selection.program, "cuda", None)  # None: every declared view counts as read in place
    in_place = None if cuda is None else frozenset(cuda.transposed_inputs) | frozenset(cuda.input_strides)
    note = (f"fastest of {len(selection.trials)} GPU builds: {best.median_us:.2f} µs "
            f"(pipeline stages {best.variant.stages}, dependent launch {launch}; {build_shape(best)})")
    return picked, note, best.build.as_dict(), best.median_us, in_place


def build_shape(trial) -> str:
    """What a timed build is, in a few words: its kernels' grids and for-loop ranges, and the forms of
    its attention chains (``warpgroup``: warpgroup MMAs; ``TMA``: K and V copied by the TMA unit)."""
    variant = trial.variant
    kernels = ", ".join(f"grid {tuple(b.grid_dim)} loop {b.forloop_range}"
                        for b in variant.graph.block_graphs())
    forms = [name for name, on in (("warpgroup", variant.warpgroup_softmax), ("TMA", variant.tma_copies),
                                   (f"multicast {variant.multicast_cluster}", variant.multicast_cluster > 1))
             if on]
    return (kernels or "no generated kernel") + "".join(f", {f}" for f in forms)


def pytorch_us(reference: KernelGraph, runner: Callable[[], Callable[[], Any]] | None) -> float | None:
    """What the subprogram takes in PyTorch on the current GPU, µs a call (CUDA-graph replays, as the
    builds are timed); None where there is nothing to time or it cannot be timed (the guard it serves
    is then skipped). ``runner`` builds the function timed (None: nothing to time): what runs where no
    build is kept (the frontend passes the subprogram's own torch ops, ``runners.torch_ops_runner``), or
    the copies a kept build adds (``runners.boundary_runner``)."""
    if runner is None:
        return None
    try:
        from mirage.codegen.profile import time_graph

        timed = runner()
        return None if timed is None else time_graph(timed, replays=100).median_us
    except Exception as error:  # noqa: BLE001 - the comparison is a guard; without it the pick stands
        logger.warning("mirage: timing %s through PyTorch failed (%s: %s); keeping the fastest build",
                       reference.name or "a subprogram", type(error).__name__, error)
        return None


def verified_candidates(reference: KernelGraph, candidates: Sequence[KernelGraph]) -> list[KernelGraph]:
    """The user's candidate µGraphs that have ``reference``'s signature and pass the verifier (finite
    fields, or the float check for graphs the fingerprint cannot interpret) and the float check.
    Where the reference and a candidate compute each index of their leading dim alone, the candidate
    is verified on one index (:class:`~mirage.verifier.slicing.SlicedVerifier`)."""
    from mirage.verifier import NotVerifiableError
    from mirage.verifier.slicing import SlicedVerifier

    out = []
    verifier = None
    for k, candidate in enumerate(candidates):
        if _signature(candidate) != _signature(reference):
            continue
        try:
            verifier = verifier or SlicedVerifier(reference, seed=0)
            equivalent = verifier.verify(candidate).equivalent
        except NotVerifiableError:
            equivalent = True  # the float check below decides
        if equivalent and _float_checked(reference, candidate):
            out.append(candidate)
        elif not equivalent:
            logger.warning("mirage: candidate %d is not equivalent to %s; ignoring it", k,
                           reference.name or "the subprogram")
    return out


def choose(reference: KernelGraph, settings: SearchSettings, *, search: bool = True,
           cache_dir: Path | None = None, progress: bool = True, profile_on: str | None = None,
           candidates: Sequence[KernelGraph] = (),
           pytorch_runner: Callable[[], Callable[[], Any]] | None = None,
           boundary_runner: Callable[[frozenset[int] | None], Callable[[], Any] | None] | None = None,
           ) -> Choice:
    """The µGraph to run for ``reference``: from the cache, from a new search, or the reference.
    Without a named search space, the one that suits ``reference`` (:func:`auto_config`).
    ``profile_on``: the name of the current GPU; the verified µGraphs are then timed on it and the
    fastest is kept (the cache entry is per GPU).  ``candidates``: µGraphs of the user's, verified
    against ``reference`` and then ranked with the search's (those of another signature are skipped).
    ``pytorch_runner``: builds what runs where no build is kept, for the guard that keeps PyTorch
    where it is faster than the fastest build (:func:`pytorch_us`); ``boundary_runner``: builds the
    copies a kept build adds around its kernels (``frontend.runners.boundary_runner``), given the
    inputs the build reads in place, charged to the build in that comparison."""
    if settings.config is None:
        settings = dataclasses.replace(settings, config=auto_config(reference))
    for widen in (with_block_budget, with_kernel_budget, with_attention_layout, with_element_grids,
                  with_row_tiles):
        settings = widen(reference, settings)
    key = cache_key(reference, settings)
    if profile_on:
        key = hashlib.sha256(f"{key}:{profile_on}".encode()).hexdigest()
    if not search:
        cache_dir = None  # search=False runs the reference graph (or the given candidates): no cache
    if cache_dir is not None:
        entry = read_entry(cache_dir, key)
        if entry is not None and _fits(entry["graph"], reference, f"cache entry {key[:16]}") \
                and _cached_graph_checked(reference, entry["graph"], _entry_path(cache_dir, key)):
            return Choice(_rename(entry["graph"], reference), "cache", key,
                          f"cached {entry['source']} result from {entry.get('created', '?')}",
                          build=entry.get("build"))
    start = time.perf_counter()
    given = verified_candidates(reference, candidates)
    split = verified_candidates(reference, split_row_candidates(reference)) if search else []
    chains = verified_candidates(reference, rowwise_candidates(reference)) if search else []
    templates = split + chains
    if not search and not given:
        return Choice(reference, "reference", key, "search disabled (search=False)")
    found, note, graphs = None, "search disabled (search=False)", []
    beyond = _beyond_the_space(reference, settings) if chains else ""
    if search and beyond:  # the one-kernel form is the row-wise µGraph's, which the search cannot give
        note = f"search skipped: {beyond}"
    elif search:
        named = dict(settings.overrides)
        if cache_dir is None and "cache" not in named:
            # no search cache (use_cache=False): the generator's store of finished searches is off too
            settings = _with_override(settings, "cache", False)
        elif cache_dir is not None and "cache_dir" not in named:
            # and its finished searches and checkpoints go where the entries go (a cache_dir option too)
            settings = _with_override(settings, "cache_dir", str(cache_dir))
        try:
            found, note, graphs, interrupted = run_search(reference, settings, progress)
            if interrupted:  # Ctrl-C stops superoptimize; the search's checkpoint keeps its units
                raise KeyboardInterrupt(f"the search for {reference.name or 'a subprogram'} was interrupted; "
                                        "the next run resumes it from its checkpoint")
            found, note, graphs = _drop_unstable(reference, found, note, graphs)
            found, note, graphs = fused_first(reference, found, note, graphs)
        except SearchUnavailable as error:
            if not given and not templates:
                return Choice(reference, "reference", key, f"fallback: {error}")
            note = f"no search: {error}"
        except Exception as error:  # a failed search must not lose the (correct) reference program
            fallback = "the verified candidates" if given or templates else "the reference graph"
            logger.warning("mirage: the search for %s failed (%s: %s); running %s",
                           reference.name or "a subprogram", type(error).__name__, error, fallback)
            message = str(error).splitlines()[0] if str(error) else ""
            reason = f"{type(error).__name__}: {message}" if message else type(error).__name__
            if isinstance(error, BrokenProcessPool):
                reason += (" (a search worker process died: out of memory or killed; "
                           "search_overrides={'workers': 1} searches in this process)")
            if not given and not templates:
                return Choice(reference, "reference", key, f"fallback: search failed: {reason}")
            note = f"search failed: {reason}"
    if split:
        note = f"{note}; {len(split)} split-row µGraph(s) float-checked"
    if chains:
        note = f"{note}; {len(chains)} one-kernel row-wise µGraph(s) verified"
    if given:
        note = f"{note}; {len(given)} of {len(candidates)} given candidate(s) verified"
    if given or templates:
        graphs = list(graphs) + given + templates
        found = found if found is not None else (given + templates)[0]
    seconds = time.perf_counter() - start
    if found is not None and not _fits(found, reference, "the searched µGraph"):
        return Choice(reference, "reference", key, "fallback: the search returned another signature")
    if found is not None and not _float_checked(reference, found):
        return Choice(reference, "reference", key, "fallback: the searched µGraph failed the float check")
    build = None
    if found is not None and profile_on:
        searched = []
        for g in [found, *graphs]:
            if g not in given + templates and g not in searched and _fits(g, reference, "a searched µGraph"):
                searched.append(g)
        ranked = searched[:max(PROFILE_CANDIDATES - len(given) - len(templates), 1)] + templates + given
        from mirage.codegen.select import SelectionError

        try:
            found, profiled, build, fastest_us, in_place = profile_choice(reference, ranked)
            note = f"{note}; {profiled}"
            eager_us = pytorch_us(reference, pytorch_runner)
            copies_us = (pytorch_us(reference, lambda: boundary_runner(in_place)) or 0.0) if (
                eager_us is not None and boundary_runner is not None) else 0.0
            if copies_us:
                note = f"{note}; its copies around the kernels: {copies_us:.2f} µs"
            if eager_us is not None and eager_us < fastest_us + copies_us:  # never slower than PyTorch
                found, build = None, None
                note = f"{note}; PyTorch runs the subprogram in {eager_us:.2f} µs, faster"
        except SelectionError as error:  # no build matched the reference on this GPU: run none of them
            logger.warning("mirage: no searched µGraph of %s matched the reference on the GPU (%s); "
                           "running the reference", reference.name or "a subprogram", error)
            found, note = None, f"{note}; none matched the reference on the GPU"
        except Exception as error:  # noqa: BLE001 - keep the cost model's pick, say why
            logger.warning("mirage: profiling %s on the GPU failed (%s: %s); keeping the cost model's pick",
                           reference.name or "a subprogram", type(error).__name__, error)
    if found is None:
        choice = Choice(reference, "reference", key, f"search found nothing better ({note})", seconds)
    else:
        source = ("candidate" if any(found is g for g in given)
                  else "split rows" if any(found is g for g in split)
                  else "row-wise" if any(found is g for g in chains) else "search")
        choice = Choice(_rename(found, reference), source, key, note, seconds, build)
    if cache_dir is not None:
        _write_entry_or_warn(cache_dir, key, reference, choice, settings)
    return choice


def _signature(graph: KernelGraph) -> tuple:
    def types(ts) -> tuple:
        return tuple((t.shape, t.dtype) for t in ts)

    return types(graph.input_types), types(graph.output_types)


def _fits(graph: KernelGraph, reference: KernelGraph, what: str) -> bool:
    if _signature(graph) == _signature(reference):
        return True
    logger.warning("mirage: %s does not take the reference's inputs or give its outputs; ignoring it", what)
    return False


def _float_check(reference: KernelGraph, candidate: KernelGraph) -> tuple[bool, str]:
    """The verifier's float check (one trial), where it exists: (equivalent, why not). Where both graphs
    compute each index of their leading dim alone (``mirage.verifier.slicing``), on one index: Stable
    Diffusion 1.5's 16 heads of 4,096 tokens took 25 s of float64 on the CPU whole."""
    try:
        from mirage.verifier import float_check
        from mirage.verifier.slicing import sliced_pair
    except ImportError:
        return True, ""
    result = float_check(*(sliced_pair(reference, candidate) or (reference, candidate)), trials=1, seed=0)
    return bool(result.equivalent), str(result.reason)


def _float_checked(reference: KernelGraph, candidate: KernelGraph) -> bool:
    """The last gate before a searched µGraph runs: the verifier's float check, where it exists."""
    equivalent, reason = _float_check(reference, candidate)
    if not equivalent:
        logger.warning("mirage: the searched µGraph for %s differs from it in floating point (%s); "
                       "running the reference graph", reference.name or "a subprogram", reason)
    return equivalent


def _cached_graph_checked(reference: KernelGraph, graph: KernelGraph, path: Path) -> bool:
    """A cache hit is checked like a fresh search result before it runs (the file may have been edited
    or belong to another program); the reference graph itself needs no check."""
    if content_hash(strip_names(graph)) == content_hash(strip_names(reference)):
        return True
    try:
        equivalent, reason = _float_check(reference, graph)
    except Exception as error:  # noqa: BLE001 - a graph the interpreter cannot run is no match
        equivalent, reason = False, f"{type(error).__name__}: {error}"
    if not equivalent:
        logger.warning("mirage: cache entry %s does not match the program (%s); searching again",
                       path, reason)
    return equivalent


def _rename(graph: KernelGraph, reference: KernelGraph) -> KernelGraph:
    """Give a cached or searched graph the reference's input names (for printing) and patterns (which
    the code generated for it may assume), its graph name and the strides its outputs are written with."""
    attrs = iter(n.attrs for n in reference.nodes if isinstance(n.attrs, KernelInput))
    nodes: list[Node] = []
    for node in graph.nodes:
        if isinstance(node.attrs, KernelInput):
            node = dataclasses.replace(node, attrs=next(attrs, KernelInput("")))
        nodes.append(node)
    return KernelGraph(tuple(nodes), graph.outputs, reference.name, reference.output_strides)
