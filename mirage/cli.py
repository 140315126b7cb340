"""The ``mirage`` command line (also ``python -m mirage``).

::

    mirage demo                          the default example end to end (search, verify, code, time)
    mirage search GRAPH.json | PROGRAM   search µGraphs for a saved graph or a PyTorch program
    mirage show GRAPH.json               print a saved graph's text form
    mirage draw GRAPH.json -o out.png    draw a saved graph (DOT always, PNG/SVG with Graphviz)
    mirage partition PROGRAM             print (and draw) how a PyTorch program is partitioned
    mirage cache list | clear            the on-disk search cache
    mirage sass ...                      SASS tools (when mirage.sass provides them)

``PROGRAM`` is ``path/to/file.py:factory`` or ``package.module:factory``; the factory returns
``(module_or_function, example_inputs)`` or a kernel graph.  Results go to standard output, progress
and notices to standard error.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mirage.errors import MirageError

logger = logging.getLogger("mirage")


class UsageError(MirageError):
    """A command-line argument names something that cannot be used."""


def _out(text: str) -> None:
    sys.stdout.write(text.rstrip("\n") + "\n")


# ---- loading programs and graphs ---------------------------------------------------------------


def load_factory(spec: str):
    """The object named by ``file.py:name`` or ``package.module:name``."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise UsageError(f"{spec!r} is not PATH.py:FACTORY or MODULE:FACTORY (for example "
                         "models.py:make or mirage.frontend.examples:gated_mlp)")
    if where.endswith(".py") or Path(where).exists():
        path = Path(where)
        if not path.exists():
            raise UsageError(f"no such file: {where}")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        if module_spec is None or module_spec.loader is None:
            raise UsageError(f"cannot import {where}")
        module = importlib.util.module_from_spec(module_spec)
        sys.path.insert(0, str(path.parent.resolve()))
        try:
            module_spec.loader.exec_module(module)
        except MirageError:
            raise
        except Exception as error:  # the user's file fails to run: say where, in one line
            raise UsageError(f"cannot import {where}: {_raised(error)}") from error
        finally:
            sys.path.pop(0)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as error:
            raise UsageError(f"cannot import module {where!r}: {error}") from None
        except MirageError:
            raise
        except Exception as error:
            raise UsageError(f"cannot import module {where!r}: {_raised(error)}") from error
    if not hasattr(module, name):
        raise UsageError(f"{where} has no {name!r}")
    return getattr(module, name)


def load_program(spec: str) -> tuple[Any, Any]:
    """Call the factory ``spec``: returns (program, example_inputs), example_inputs None for graphs."""
    from mirage.mugraph import KernelGraph, KNGraph

    factory = load_factory(spec)
    if not callable(factory):
        raise UsageError(f"{spec} is a value of type {type(factory).__name__}, not a function: name a "
                         "factory that takes no arguments and returns (module, example_inputs) or a kernel "
                         "graph")
    try:
        signature = inspect.signature(factory)
    except ValueError:  # a builtin without a signature to inspect: calling it will tell
        signature = None
    if signature is not None:
        try:
            signature.bind()
        except TypeError as error:
            raise UsageError(f"{spec} cannot be called without arguments ({error}): name a factory that "
                             "takes no arguments, or wrap this one in one that does") from None
    try:
        made = factory()
    except MirageError:
        raise
    except Exception as error:
        raise UsageError(f"{spec} failed: {_raised(error)}") from error
    if isinstance(made, (KernelGraph, KNGraph)):
        return made, None
    if isinstance(made, tuple) and len(made) == 2:
        return made
    raise UsageError(f"{spec} returned a {type(made).__name__}; a factory returns (module, example_inputs) "
                     "or a kernel graph")


def _raised(error: BaseException) -> str:
    """``error`` in one line, with the place in the user's code where it was raised (the whole
    traceback is logged at debug level: ``mirage -v``)."""
    import traceback

    logger.debug("".join(traceback.format_exception(error)).rstrip())
    if isinstance(error, SyntaxError) and error.filename:
        where = f"{error.filename}:{error.lineno}"
    else:
        frames = traceback.extract_tb(error.__traceback__)
        user = [f for f in frames if "importlib" not in f.filename and f.filename != __file__]
        where = f"{user[-1].filename}:{user[-1].lineno}" if user else ""
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return f"{text}" + (f" (at {where})" if where else "") + " (mirage -v shows the traceback)"


def load_graph(path: str):
    from mirage.mugraph import load

    if not Path(path).exists():
        raise UsageError(f"no such graph file: {path} (save one with g.to_json(path))")
    try:
        return load(path)
    except UnicodeDecodeError as error:
        raise UsageError(f"{path} is not a saved graph: it is not UTF-8 text (byte {error.start}: "
                         f"{error.reason}); pass a file written by g.to_json(path)") from None


def _draw_format(output: str) -> str | None:
    """The drawing format named by ``output``'s extension, any case (out.DOT is DOT)."""
    return Path(output).suffix.lstrip(".").lower() or None


def _save_graph(graph, path: str | Path) -> None:
    graph.to_json(path)
    _out(f"saved {path}")


# ---- commands -------------------------------------------------------------------------------------


def _time_limit(args) -> float:
    if not math.isfinite(args.time_limit) or args.time_limit <= 0:
        raise UsageError(f"--time-limit must be a finite positive number of seconds (such as 30), got "
                         f"{args.time_limit:g}")
    return args.time_limit


def _options(args) -> dict:
    options = {"search": not getattr(args, "no_search", False), "time_limit_s": _time_limit(args),
               "use_cache": not args.no_cache}
    if getattr(args, "config", None):
        options["config"] = args.config
    return options


def _not_a_folder(output: str) -> None:
    if Path(output).expanduser().is_dir():
        raise UsageError(f"cannot save to {output}: it is a folder; name a file (in it, or elsewhere)")


def _writable_target(output: str | None) -> None:
    """Fail before a long search, not after it, where ``output``'s folder does not exist or ``output``
    is a folder."""
    if not output:
        return
    _not_a_folder(output)
    if not Path(output).expanduser().resolve().parent.is_dir():
        raise UsageError(f"cannot save to {output}: its folder {Path(output).parent} does not exist; make "
                         "it first or name another path")


def cmd_search(args) -> int:
    import mirage

    _writable_target(args.output)
    if args.target.endswith(".json"):
        graph = load_graph(args.target)
        module = mirage.superoptimize(graph, **_options(args))
        choice = module.choice
        _out(f"µGraph from {choice.source}: {choice.detail}")
        _out(str(choice.graph))
        if args.output:
            _save_graph(choice.graph, args.output)
        return 0
    program, example_inputs = load_program(args.target)
    if example_inputs is None:
        module = mirage.superoptimize(program, **_options(args))
        _out(f"µGraph from {module.choice.source}: {module.choice.detail}\n{module.choice.graph}")
        if args.output:
            _save_graph(module.choice.graph, args.output)
        return 0
    module = mirage.superoptimize(program, example_inputs, **_options(args))
    _out(module.report())
    if args.output:
        _save_subprogram_graphs(module, args.output)
    return 0


def _save_subprogram_graphs(module, output: str) -> None:
    """Save the chosen µGraph of each subprogram: to ``output`` when there is one subprogram, else to
    ``OUT.sp0.json``, ``OUT.sp1.json``, ... beside it."""
    spec = module.specializations[-1]
    subprograms = spec.partition.subprograms
    if not subprograms:
        raise UsageError(f"nothing saved to {output}: the program has no subprogram that mirage runs as a "
                         "µGraph (all of it stays in PyTorch); see `mirage partition` for why")
    if len(subprograms) == 1:
        _save_graph(spec.choices[subprograms[0].name].graph, output)
        return
    path = Path(output)
    for s in subprograms:
        name = f"{path.stem}.{s.name}{path.suffix or '.json'}"
        _save_graph(spec.choices[s.name].graph, path.with_name(name))


def cmd_show(args) -> int:
    graph = load_graph(args.graph)
    _out(str(graph))
    _out(f"content hash {graph.content_hash()}")
    return 0


def cmd_draw(args) -> int:
    from mirage.mugraph.visualize import render

    _not_a_folder(args.output)
    graph = load_graph(args.graph)
    _out(f"wrote {render(graph, args.output, _draw_format(args.output))}")
    return 0


def cmd_partition(args) -> int:
    from mirage.api import _split_inputs
    from mirage.frontend.capture import as_module, capture
    from mirage.frontend.draw import partition_dot, render
    from mirage.frontend.partition import Budget, partition

    if args.max_ops < 1:
        raise UsageError(f"--max-ops must be a positive number of kernel-graph ops per subprogram, got "
                         f"{args.max_ops} (the default is 16)")
    _writable_target(args.output)
    program, example_inputs = load_program(args.program)
    if example_inputs is None:
        raise UsageError(f"{args.program} returned a kernel graph; `mirage partition` takes PyTorch programs")
    inputs, kwargs = _split_inputs(example_inputs)
    gm = capture(as_module(program), inputs, kwargs)
    part = partition(gm, Budget(max_ops=args.max_ops))
    _out(str(part))
    if args.output:
        _out(f"wrote {render(partition_dot(gm.graph, part), args.output, _draw_format(args.output))}")
    return 0


def cmd_ops(args) -> int:
    """What capture and the lowering take from a PyTorch program: the aten ops that become µGraph ops
    (or relabel a computed value's shape), then those that capture first writes as other ops."""
    from mirage.frontend.decompositions import described
    from mirage.frontend.lowering import LOWERINGS, Kind

    pattern = (args.name or "").lower()
    rows = [(name, lowering.kind.value, lowering.doc) for name, lowering in sorted(LOWERINGS.items())]
    rows += [(name, "capture", doc) for name, doc in described()]
    rows = [row for row in rows if pattern in row[0].lower()]
    if not rows:
        raise UsageError(f"no op named like {args.name!r} lowers: it runs in PyTorch (`mirage ops` lists "
                         "every one that lowers)")
    width = max(len(name) for name, _, _ in rows)
    for name, kind, doc in rows:
        _out(f"{name:<{width}}  {kind:<7}  {doc}")
    compute = sum(1 for _, kind, _ in rows if kind == Kind.COMPUTE.value)
    _out(f"{len(rows)} op(s): {compute} computed, {sum(1 for r in rows if r[1] == 'capture')} rewritten at "
         "capture, the rest shape relabels; any other op runs in PyTorch and splits its program there")
    return 0


def cmd_cache(args) -> int:
    from mirage import config
    from mirage.frontend.optimize import clear_entries, list_entries

    directory = Path(args.dir).expanduser() if args.dir else config.settings().search_cache_dir
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"{directory} is a file, not a cache folder; pass the folder given as "
                         "MIRAGE_CACHE_DIR or --dir (its search/ folder holds the entries)")
    if args.dir and not directory.exists():
        raise UsageError(f"no cache folder {directory}: nothing to {args.action}")
    if args.action == "clear":
        _out(f"removed {clear_entries(directory)} cached item(s) (entries, and the searches' stored "
             f"results) from {directory}")
        return 0
    rows = list_entries(directory)
    _out(f"{len(rows)} entries in {directory}")
    for row in rows:
        _out(f"{row['key'][:16]}  {row['created'] or '-':25}  {row['source'] or '-':9}  "
             f"{row['bytes']:>8} B  {row['name'] or '-'}  {row['detail']}")
    return 0


def cmd_demo(args) -> int:
    from mirage import config
    from mirage.frontend.demo import run_demo

    output_dir = Path(args.output_dir).expanduser()
    if output_dir.exists() and not output_dir.is_dir():
        raise UsageError(f"--output-dir {args.output_dir} is a file; name a folder for the generated code")
    result = run_demo(scale=args.scale, search=not args.no_search, time_limit_s=_time_limit(args),
                      use_cache=not args.no_cache, output_dir=Path(args.output_dir),
                      progress=config.settings().progress, config=args.config)
    for line in result.lines:
        _out(line)
    return 0 if result.passed else 1


# ---- parser ---------------------------------------------------------------------------------------


def _search_flags(parser: argparse.ArgumentParser, default_time: float) -> None:
    parser.add_argument("--config", help="search space name (mlp, attention, lora)")
    parser.add_argument("--time-limit", type=float, default=default_time, metavar="S",
                        help=f"search budget per subprogram in seconds (default {default_time:g})")
    parser.add_argument("--no-cache", action="store_true", help="neither read nor write the search cache")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mirage", description="Superoptimize tensor programs for GPUs.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    demo = sub.add_parser("demo", help="RMSNorm + linear end to end: search, verify, generate, time")
    demo.add_argument("--scale", type=int, default=1, help="size multiplier of the example (default 1)")
    demo.add_argument("--no-search", action="store_true", help="skip the search (reference µGraphs)")
    demo.add_argument("--output-dir", default="mirage-demo", help="where generated code goes")
    _search_flags(demo, 30.0)
    demo.set_defaults(run=cmd_demo)

    search = sub.add_parser("search", help="search µGraphs for a saved graph or a PyTorch program")
    search.add_argument("target", help="GRAPH.json, or PATH.py:FACTORY / MODULE:FACTORY")
    search.add_argument("-o", "--output", metavar="OUT.json",
                        help="save the chosen µGraph (JSON); for a program cut into several subprograms, "
                             "one file per subprogram (OUT.sp0.json, OUT.sp1.json, ...)")
    _search_flags(search, 30.0)
    search.set_defaults(run=cmd_search)

    show = sub.add_parser("show", help="print a saved graph")
    show.add_argument("graph", help="GRAPH.json")
    show.set_defaults(run=cmd_show)

    draw = sub.add_parser("draw", help="draw a saved graph")
    draw.add_argument("graph", help="GRAPH.json")
    draw.add_argument("-o", "--output", required=True, help="out.dot, out.png, out.svg or out.pdf")
    draw.set_defaults(run=cmd_draw)

    part = sub.add_parser("partition", help="show how a PyTorch program is cut into LAX subprograms")
    part.add_argument("program", help="PATH.py:FACTORY or MODULE:FACTORY returning (module, inputs)")
    part.add_argument("--max-ops", type=int, default=16,
                      help="kernel-graph ops per subprogram, a positive integer (default 16)")
    part.add_argument("-o", "--output", help="draw the partition (out.dot, out.png, out.svg)")
    part.set_defaults(run=cmd_partition)

    ops = sub.add_parser("ops", help="list the PyTorch ops that lower to µGraph ops")
    ops.add_argument("name", nargs="?", help="only ops whose name holds this (e.g. norm)")
    ops.set_defaults(run=cmd_ops)

    cache = sub.add_parser("cache", help="list or clear the search cache")
    cache.add_argument("action", choices=("list", "clear"))
    cache.add_argument("--dir", help="cache directory (default: $MIRAGE_CACHE_DIR/search)")
    cache.set_defaults(run=cmd_cache)

    try:
        from mirage.sass.cli import add_subparsers
    except ImportError:
        pass
    else:
        add_subparsers(sub)
    return parser


def _setup_logging(args):
    from mirage import config

    try:
        level = config.settings().log_level
    except MirageError:
        level = "INFO"
    if args.verbose:
        level = "DEBUG"
    elif args.quiet:
        level = "WARNING"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger("mirage")
    saved = (root.handlers[:], root.level, root.propagate)
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level, logging.INFO))
    root.propagate = False

    def restore() -> None:  # main() may run inside another program (or a test): leave no trace
        root.handlers[:], root.level, root.propagate = saved[0], saved[1], saved[2]

    return restore


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    restore_logging = _setup_logging(args)
    try:
        return int(args.run(args) or 0)
    except MirageError as error:
        sys.stderr.write(f"mirage {args.command}: error: {error}\n")
        return 2
    except OSError as error:  # a file named on the command line cannot be read or written
        where = f": {error.filename}" if error.filename else ""
        sys.stderr.write(f"mirage {args.command}: error: {error.strerror or error}{where}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    finally:
        restore_logging()
