"""``mirage demo``: the default example (RMSNorm followed by a linear layer) end to end.

Stages: capture and partition the PyTorch module, search a µGraph per subprogram, verify the chosen
µGraphs (finite-field test when mirage.verifier offers it, and always a floating-point check of the
whole module against eager PyTorch), generate CUDA (when mirage.codegen offers it), and on a GPU
run and time the module against eager PyTorch.  Each stage reports what it did or why it was
skipped; nothing is claimed that did not run.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

logger = logging.getLogger("mirage.demo")


@dataclass
class DemoResult:
    lines: list[str] = field(default_factory=list)
    max_error: float = float("nan")
    passed: bool = False

    def add(self, stage: str, text: str) -> None:
        self.lines.append(f"{stage:10} {text}")
        logger.debug("%s: %s", stage, text)


def _verify(reference, chosen) -> str:
    if chosen == reference:
        return "chosen µGraph is the reference graph (nothing to prove)"
    try:
        from mirage.verifier import verify
    except ImportError:
        return "finite-field verifier not available in this installation"
    result = verify(reference, chosen)
    verdict = "equivalent" if result.equivalent else f"NOT equivalent ({result.reason})"
    bound = "" if result.error_bound is None else f", error bound {result.error_bound:.1e}"
    guarantee = getattr(result.guarantee, "value", result.guarantee)
    return (f"finite-field test: {verdict}{bound} after {result.tests_run} test(s), guarantee {guarantee}, "
            f"{result.seconds:.2f} s")


def _generate(graph, directory: Path) -> str:
    try:
        from mirage.codegen import generate_cuda_program
    except ImportError:
        return "CUDA generation not available in this installation (mirage.codegen.generate_cuda_program)"
    program = generate_cuda_program(graph, target_cc=90)
    source = program["code"] if isinstance(program, dict) else getattr(program, "code", str(program))
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{graph.name or 'graph'}.cu"
    path.write_text(source)
    return f"wrote {path} ({len(source.splitlines())} lines)"


def _time_cuda(eager, ours, replayed) -> tuple[dict[str, float], dict[str, float]]:
    """Device time of a call (CUDA-graph replays) of the eager program and ours (``{"eager": …,
    "mirage": …}``), and host time of a call issued eagerly, µs, of those and of ours with
    ``cuda_graphs`` (``"replayed"``): the first is what the kernels take, the second what a loop of
    eager calls costs the CPU (rounds taken in turn)."""
    from mirage.codegen.profile import host_times, time_graph

    fns = {"eager": eager, "mirage": ours}
    device = {name: time_graph(fn).median_us for name, fn in fns.items()}
    return device, host_times({**fns, "replayed": replayed}, calls=200)


def run_demo(scale: int = 1, search: bool = True, time_limit_s: float = 30.0, use_cache: bool = True,
             output_dir: Path = Path("mirage-demo"), progress: bool = True,
             config: str | None = None) -> DemoResult:
    """``config``: the search space name (``superoptimize``'s option); None: chosen per subprogram."""
    from tqdm.auto import tqdm

    import mirage
    from mirage.frontend.errors import OptionError
    from mirage.frontend.examples import rmsnorm_linear
    from mirage.frontend.options import Options

    if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
        raise OptionError(f"scale must be a positive integer (the example's size multiplier), got {scale!r}")
    options = {"search": search, "time_limit_s": time_limit_s, "use_cache": use_cache, "progress": progress,
               "config": config}
    Options.parse(**options)  # a bad option is reported before any work

    result = DemoResult()
    stages = tqdm(total=5, desc="mirage demo", unit="stage", disable=not progress)
    module, inputs = rmsnorm_linear(scale)
    result.add("program", f"RMSNorm({inputs[0].shape[-1]}) + Linear -> {module.proj.out_features}, "
                          f"input {list(inputs[0].shape)} float32")
    stages.set_postfix_str("capture, partition, search")
    start = time.perf_counter()
    fast = mirage.superoptimize(module, inputs, **options)
    spec = fast.specializations[0]
    result.add("partition", spec.partition.summary())
    for s in spec.partition.subprograms:
        choice = spec.choices[s.name]
        result.add("search", f"{s.name}: µGraph from {choice.source} ({choice.detail}) "
                             f"in {time.perf_counter() - start:.1f} s")
        result.lines += ["           " + line for line in str(choice.graph).splitlines()]
    stages.update(2)
    stages.set_postfix_str("verify")
    for s in spec.partition.subprograms:
        result.add("verify", f"{s.name}: {_verify(s.graph, spec.choices[s.name].graph)}")
    with torch.no_grad():
        expected, got = module(*inputs), fast(*inputs)
    result.max_error = float((expected - got).abs().max())
    result.passed = bool(torch.allclose(expected, got, rtol=1e-4, atol=1e-4))
    result.add("verify", f"float check against eager PyTorch: max abs error {result.max_error:.2e} "
                         f"({'pass' if result.passed else 'FAIL'})")
    stages.update(1)
    stages.set_postfix_str("generate")
    for s in spec.partition.subprograms:
        result.add("codegen", f"{s.name}: {_generate(spec.choices[s.name].graph, output_dir)}")
    stages.update(1)
    stages.set_postfix_str("GPU")
    if torch.cuda.is_available():
        gpu_module = module.cuda().half()
        gpu_inputs = tuple(x.cuda().half() for x in inputs)
        gpu_fast = mirage.superoptimize(gpu_module, gpu_inputs, **options)
        replaying = mirage.superoptimize(gpu_module, gpu_inputs, **options, cuda_graphs=True)  # (cached)
        with torch.no_grad():
            gpu_module(*gpu_inputs), gpu_fast(*gpu_inputs)  # specialized and loaded before any capture
            torch.testing.assert_close(replaying(*gpu_inputs), gpu_module(*gpu_inputs), rtol=2e-2, atol=2e-2)
            torch.cuda.synchronize()
            device, host = _time_cuda(lambda: gpu_module(*gpu_inputs), lambda: gpu_fast(*gpu_inputs),
                                      lambda: replaying(*gpu_inputs))
        result.add("gpu", f"{torch.cuda.get_device_name()}, device time a call (CUDA graph): eager "
                          f"{device['eager']:.1f} µs, mirage {device['mirage']:.1f} µs "
                          f"({device['eager'] / device['mirage']:.2f}x)")
        result.add("gpu", f"host time a call (eager calls in a loop): eager {host['eager']:.1f} µs, "
                          f"mirage {host['mirage']:.1f} µs, mirage with cuda_graphs=True "
                          f"{host['replayed']:.1f} µs; small programs called in a loop are bound by it")
    else:
        result.add("gpu", "no CUDA device: compile and timing skipped")
    stages.update(1)
    stages.close()
    return result
