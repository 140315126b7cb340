"""How fast the GPU streams the weights of the GEMV cases: a read-only floor (a kernel that only reads
the weight, 16 bytes a thread per load, several loads in flight), cuBLAS's product (``torch.mm``) and
our plain weight-streaming GEMV (``rms_forms.gemv``: X @ W, no norm), on the same weights.

The suite's roofline divides by the device-to-device copy bandwidth; a stream that only reads can go
faster than a copy, so this says how much room the GEMV cases have beyond that roofline.  Prints one
line per measurement and writes stream_floor_<date>.json into ``--out`` (default
benchmarks/results)."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import warnings
from pathlib import Path

import torch

import mirage as mi
from benchmarks.rms_forms import gemv, relative_error
from mirage.codegen.lower_program import generate_cuda_program
from mirage.codegen.profile import device_facts, kernel_times, time_graph
from mirage.codegen.runtime import build_many
from mirage.optimizer import OptimizerOptions

# each thread keeps UNROLL 16-byte loads in flight; the XOR keeps the compiler from dropping them
READ_KERNEL = r"""
extern "C" __global__ void read_all(const int4* __restrict__ p, long long n, int* out) {
  constexpr int UNROLL = 4;
  int acc = 0;
  const long long stride = (long long)gridDim.x * blockDim.x;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + (UNROLL - 1) * stride < n; i += UNROLL * stride) {
    int4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) v[u] = __ldcs(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) { const int4 v = __ldcs(p + i); acc ^= v.x ^ v.y ^ v.z ^ v.w; }
  if (acc == 0x5eed) out[0] = acc;
}
"""

# the same read, each block its own box of rows and columns of the (K, N) weight: the access pattern
# of a GEMV whose blocks split N into strips and K into chunks
TILE_READ_KERNEL = r"""
extern "C" __global__ void read_boxes(const int4* __restrict__ p, int row_vectors, int box_rows,
                                      int box_vectors, int* out) {
  constexpr int UNROLL = 4;
  const int strip = blockIdx.x, chunk = blockIdx.y;
  const int total = box_rows * box_vectors;
  const int4* base = p + (long long)chunk * box_rows * row_vectors + (long long)strip * box_vectors;
  int acc = 0;
  int i = threadIdx.x;
  for (; i + (UNROLL - 1) * (int)blockDim.x < total; i += UNROLL * blockDim.x) {
    int4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int e = i + u * blockDim.x;
      v[u] = __ldcs(base + (long long)(e / box_vectors) * row_vectors + e % box_vectors);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < total; i += blockDim.x) {
    const int4 v = __ldcs(base + (long long)(i / box_vectors) * row_vectors + i % box_vectors);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x5eed) out[0] = acc;
}
"""

# weight (K, N) and activation rows of each GEMV case; gatedmlp reads two weights of 4096 x 4096
CASES = {"rmsnorm_b1": (2, (4096, 6144), 1), "rmsnorm_b8": (16, (4096, 6144), 1),
         "gatedmlp_m1": (1, (4096, 4096), 2), "gatedmlp_m8": (8, (4096, 4096), 2)}


def cuda_kernel(source: str, name: str, shared_bytes: int = 0, extra_options: tuple[str, ...] = ()):
    """A CuPy kernel of hand-written CUDA (C++17), allowed ``shared_bytes`` of dynamic shared memory."""
    import cupy

    kernel = cupy.RawKernel(source, name, options=("-std=c++17", *extra_options))
    if shared_bytes:
        kernel.max_dynamic_shared_size_bytes = shared_bytes
    return kernel


def launch(kernel, grid: tuple, block: tuple, arguments: tuple, shared_bytes: int = 0) -> None:
    """Launch on torch's current stream, the one that ``time_graph`` captures."""
    import cupy

    with warnings.catch_warnings():  # CuPy 14 deprecates ExternalStream; a raw handle still needs it
        warnings.simplefilter("ignore", DeprecationWarning)
        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    kernel(grid, block, arguments, shared_mem=shared_bytes, stream=stream)


def read_floor(weights: list[torch.Tensor], sm_count: int) -> tuple[float, int]:
    """The fastest read of ``weights`` over a few grid sizes: (µs, blocks per SM)."""
    import cupy

    kernel = cuda_kernel(READ_KERNEL, "read_all")
    sink = torch.zeros(1, dtype=torch.int32, device="cuda")
    best = None
    for per_sm in (1, 2, 4, 8):
        def run(per_sm=per_sm):
            for w in weights:
                n = w.numel() * w.element_size() // 16
                launch(kernel, (sm_count * per_sm,), (512,), (w.data_ptr(), cupy.int64(n), sink.data_ptr()))
        us = time_graph(run, replays=100).median_us
        if best is None or us < best[0]:
            best = (us, per_sm)
    return best


def box_reader(weight: torch.Tensor, strips: int, chunks: int, threads: int):
    """A function that reads ``weight`` (K, N) once, a grid of ``strips`` column strips × ``chunks``
    row chunks, each block its own box."""
    import cupy

    kernel = cuda_kernel(TILE_READ_KERNEL, "read_boxes")
    sink = torch.zeros(1, dtype=torch.int32, device="cuda")
    rows, cols = weight.shape
    row_vectors = cols * weight.element_size() // 16
    arguments = (weight.data_ptr(), cupy.int32(row_vectors), cupy.int32(rows // chunks),
                 cupy.int32(row_vectors // strips), sink.data_ptr())
    return lambda: launch(kernel, (strips, chunks), (threads,), arguments)


def read_boxes(weight: torch.Tensor, strips: int, chunks: int, threads: int) -> float:
    """µs to read ``weight`` box by box (:func:`box_reader`)."""
    return time_graph(box_reader(weight, strips, chunks, threads), replays=100).median_us


def split_k_gemv(b: int, n_blocks: int, k_splits: int, iters: int, threads: int) -> mi.KernelGraph:
    """X @ W (rmsnorm's shapes, as (1, rows, cols) views) with K split across ``k_splits`` blocks:
    kernel 1 writes one partial product per split, kernel 2 sums them.  Each block reads only its
    split's columns of X, and rows of W ``6144 / n_blocks`` columns wide."""
    g = mi.new_kernel_graph("split_k_gemv")
    x = g.new_input(dims=(1, 2 * b, 4096), dtype=mi.float16)
    w = g.new_input(dims=(1, 4096, 6144), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(n_blocks, k_splits, 1), block_dim=(threads, 1, 1),
                                  forloop_range=iters)
    bx = tb.new_input(x, input_map=(-1, 2, -1), forloop_dim=2)
    bw = tb.new_input(w, input_map=(2, 1, -1), forloop_dim=1)
    tb.new_output(tb.forloop_accum(tb.matmul(bx, bw)), output_map=(2, 0, -1))  # (k_splits, rows, n)
    (partials,) = g.customized([x, w], tb)
    tb2 = mi.new_threadblock_graph(grid_dim=(n_blocks, 1, 1), block_dim=(threads, 1, 1),
                                   forloop_range=k_splits)
    bp = tb2.new_input(partials, input_map=(2, -1, -1), forloop_dim=0)
    tb2.new_output(tb2.forloop_accum(bp), output_map=(2, -1, -1))  # the splits' partials added
    (out,) = g.customized([partials], tb2)
    g.mark_output(out)
    return g.freeze()


def library_forms(case: str, m: int, shape: tuple, count: int) -> list[dict]:
    """The library's product ``X @ W`` of ``case``'s shapes in the forms a pre-defined matmul could take:
    as written, as the transposed product ``(Wᵀ · Xᵀ)ᵀ`` (the weight as the long operand), through
    each BLAS back-end torch offers, and with the fp16 reductions kept at full precision."""
    weights = [torch.randn(shape, device="cuda").half() for _ in range(count)]
    x = torch.randn(m, shape[0], device="cuda").half()
    forms = {"mm": lambda w: torch.mm(x, w), "transposed": lambda w: torch.mm(w.t(), x.t()).t()}
    matmul, blas = torch.backends.cuda.matmul, torch.backends.cuda.preferred_blas_library
    rows = []
    for backend in ("cublas", "cublaslt"):
        for reduced in (True, False):
            before = blas(), matmul.allow_fp16_reduced_precision_reduction
            blas(backend)
            matmul.allow_fp16_reduced_precision_reduction = reduced
            try:
                for name, form in forms.items():
                    us = time_graph(lambda f=form: [f(w) for w in weights], replays=100).median_us
                    rows.append({"case": case, "what": f"library {name}", "backend": backend,
                                 "reduced_precision": reduced, "us": us})
                    print(rows[-1], flush=True)
            finally:
                blas(before[0])
                matmul.allow_fp16_reduced_precision_reduction = before[1]
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results", help="folder of the JSON record")
    parser.add_argument("--parts", default="floor,boxes,gemv,split_k",
                        help="which measurements: floor (read and torch.mm), library (the library's product "
                             "in several forms and BLAS back-ends), boxes (reads by box shape), "
                             "gemv (our plain GEMV), split_k (our split-K GEMV, the sum in a kernel of "
                             "its own; split_k_folds: also folded by a counter; split_k_wide: grids of "
                             "256-512 blocks)")
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    facts = device_facts()
    rows = []
    for case, (m, shape, count) in CASES.items() if "floor" in parts else ():
        weights = [torch.randn(shape, device="cuda").half() for _ in range(count)]
        x = torch.randn(m, shape[0], device="cuda").half()
        megabytes = sum(w.numel() * 2 for w in weights) / 1e6
        us, per_sm = read_floor(weights, facts["sm_count"])
        rows.append({"case": case, "what": "read", "us": us, "blocks_per_sm": per_sm, "MB": megabytes})
        mm = time_graph(lambda x=x, ws=weights: [torch.mm(x, w) for w in ws], replays=100).median_us
        rows.append({"case": case, "what": "torch.mm", "us": mm, "MB": megabytes})
        for row in rows[-2:]:
            print(row, f"{row['MB'] / row['us']:.2f} TB/s", flush=True)
    for case, (m, shape, count) in CASES.items() if "library" in parts else ():
        rows += library_forms(case, m, shape, count)
    if "boxes" in parts:  # rmsnorm's weight read box by box: strips of N × chunks of K
        weight = torch.randn(4096, 6144, device="cuda").half()
        for strips, chunks in ((128, 1), (64, 2), (32, 4), (16, 8), (8, 16), (1, 128), (128, 2), (16, 16)):
            for threads in (256, 512):
                us = read_boxes(weight, strips, chunks, threads)
                rows.append({"case": "rmsnorm", "what": "read boxes", "grid": [strips, chunks],
                             "threads": threads, "us": us, "MB": weight.numel() * 2 / 1e6})
                print(rows[-1], f"{rows[-1]['MB'] / us:.2f} TB/s", flush=True)
    # our plain GEMV (one weight, rmsnorm's shapes): the members the rmsnorm family keeps
    builds, programs = [], []
    for b in (1, 8) if "gemv" in parts else ():
        for iters, threads, stages in ((8, 256, 3), (16, 256, 3), (8, 512, 3), (16, 512, 2)):
            options = dataclasses.replace(OptimizerOptions(), stages=stages)
            programs.append(generate_cuda_program(gemv(b, 128, iters, threads), None, options=options))
            builds.append({"case": f"rmsnorm_b{b}", "what": "mirage gemv", "iters": iters, "threads": threads,
                           "stages": stages})
    # the same product with K split across blocks, the sum in a kernel of its own or folded into the
    # product's kernel (clusters where they fit, else a counter)
    folds = ("none", "counter") if "split_k_folds" in parts else ("none",)
    for b in (1, 8) if parts & {"split_k", "split_k_folds", "split_k_wide"} else ():
        # 128 blocks, one an SM; with split_k_wide, grids of 256 and 512 blocks, as many an SM as their
        # shared memory lets in (the box reads of such grids are the fastest reads of the weight:
        # read_boxes (16, 16))
        grids = (((64, 2), (32, 4), (16, 8), (8, 16)) if parts & {"split_k", "split_k_folds"} else ()) + (
            ((128, 2), (64, 4), (32, 8), (16, 16), (32, 16)) if "split_k_wide" in parts else ())
        for n_blocks, k_splits in grids:
            wide = n_blocks * k_splits > 128
            # K tiles of 32-128 rows: the wide strips' tiles fit in shared memory only when short
            axes = itertools.product((64, 128) if wide else (32, 64, 128), (256, 512), (2, 3, 4),
                                     ("none",) if wide else folds)
            for tile, threads, stages, fold in axes:
                if 4096 // k_splits < tile:
                    continue
                options = dataclasses.replace(OptimizerOptions(), stages=stages,
                                              counter_folds=fold == "counter")
                graph = split_k_gemv(b, n_blocks, k_splits, 4096 // k_splits // tile, threads)
                try:
                    programs.append(generate_cuda_program(graph, None, options=options))
                except mi.MirageError as error:
                    print("skipped", b, n_blocks, k_splits, tile, threads, stages, fold, error)
                    continue
                builds.append({"case": f"rmsnorm_b{b}", "what": "split-K gemv", "grid": [n_blocks, k_splits],
                               "k_tile": tile, "threads": threads, "stages": stages, "folded": fold})
    loaded = []
    for row, program in zip(builds, build_many(programs), strict=True):
        b = int(row["case"][-1])
        inputs = [torch.randn(2 * b, 4096, device="cuda").half(), torch.randn(1, 4096, device="cuda").half(),
                  torch.randn(4096, 6144, device="cuda").half()]
        if row["what"] == "split-K gemv":
            inputs = [inputs[0][None], inputs[2][None]]
        if isinstance(program, Exception):
            print("not built", row, str(program).splitlines()[0])
            continue
        program.load()
        row["relative_error"] = relative_error(program, inputs)
        row["us"] = time_graph(lambda p=program, x=inputs: p.launch(x), replays=100).median_us
        row["MB"] = 4096 * 6144 * 2 / 1e6
        rows.append(row)
        loaded.append((row, program, inputs))
        print(row, f"{row['MB'] / row['us']:.2f} TB/s", flush=True)
    for case in sorted({row["case"] for row, _, _ in loaded}):  # the fastest builds' kernels, one by one
        fastest = sorted((x for x in loaded if x[0]["case"] == case), key=lambda x: x[0]["us"])[:3]
        for row, program, inputs in fastest:
            row["kernel_us"] = kernel_times(lambda p=program, x=inputs: p.launch(x))
            print(case, row.get("grid"), row["us"], row["kernel_us"], flush=True)
    write_record(args.out, "stream_floor", facts, rows)


def print_times(times: dict[str, float], by_time: bool = False) -> None:
    """One line per entry of ``times`` (label → µs), fastest first where ``by_time``."""
    items = sorted(times.items(), key=lambda kv: kv[1]) if by_time else times.items()
    for label, us in items:
        print(f"    {us:8.2f} µs  {label}", flush=True)


def program_arguments(doc: str, argv=None, programs: str = "", time_limit: float | None = None,
                      compile_option: bool = False):
    """The command line of a benchmark over named programs: ``--out`` (the folder of its JSON record),
    ``--programs`` (comma-separated; ``programs`` by default, "" for all) and, with a default
    ``time_limit``, ``--time-limit`` (the search budget per subprogram) and ``--split-rounds`` (the
    frontend's ``split_rounds``: how often fruitless subprograms are split and searched again);
    ``compile_option``: ``--compile`` (time torch.compile too).
    ``doc``: the module's docstring, whose first line describes the command.  Returns the parsed
    arguments, ``wanted`` added: the set of programs asked for (empty: all)."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results", help="folder of the JSON record")
    parser.add_argument("--programs", default=programs, help="only these programs (comma-separated)")
    if time_limit is not None:
        parser.add_argument("--time-limit", type=float, default=time_limit,
                            help="search budget per subprogram, s")
        parser.add_argument("--split-rounds", type=int, default=1,
                            help="rounds of splitting fruitless subprograms (Options.split_rounds)")
    if compile_option:
        parser.add_argument("--compile", action="store_true",
                            help="also time torch.compile (mode max-autotune-no-cudagraphs, as the suite)")
    args = parser.parse_args(argv)
    args.wanted = set(filter(None, args.programs.split(",")))
    return args


def write_record(folder: str, name: str, facts: dict, rows: list, **more) -> Path:
    """Write ``{facts, rows, **more}`` as ``<name>_<date>.json`` into ``folder`` (made if missing)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}_{facts['date']}.json"
    path.write_text(json.dumps({"facts": facts, "rows": rows, **more}, indent=1))
    print("wrote", path)
    return path


if __name__ == "__main__":
    main()
