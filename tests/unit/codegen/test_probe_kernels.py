"""The hand-written CUDA of the streaming probes (benchmarks/stream_floor.py, benchmarks/gemv_warps.py)
compiles for sm_90 and takes the paths it claims: 16-byte loads, `cp.async` copies, tensor-core
products, no spills, and no block barrier inside the warp-owned GEMV's loop (its two barriers are
after the loop). The GPU runs are the benchmarks themselves."""

from __future__ import annotations

import re
import subprocess

import pytest
from codegen_helpers import needs_nvcc

from benchmarks.gemv_warps import COPY_SOURCE, SOURCE
from benchmarks.stream_floor import READ_KERNEL, TILE_READ_KERNEL
from mirage.codegen.toolchain import find_nvcc

pytestmark = needs_nvcc


def _sass(tmp_path, source: str) -> str:
    cu, cubin = tmp_path / "probe.cu", tmp_path / "probe.cubin"
    cu.write_text(source)
    nvcc = find_nvcc()
    subprocess.run([str(nvcc), "-arch=sm_90", "-std=c++17", "-cubin", "-o", str(cubin), str(cu)], check=True)
    from mirage.codegen.compile import cubin_to_sass

    return cubin_to_sass(cubin)


@pytest.mark.parametrize("source", [READ_KERNEL, TILE_READ_KERNEL], ids=["read", "boxes"])
def test_read_kernels_load_16_bytes_a_thread(tmp_path, source):
    sass = _sass(tmp_path, source)
    assert "LDG.E.EF.128" in sass or "LDG.E.128" in sass
    assert "LDL" not in sass and "STL" not in sass


def test_copy_probe_reads_through_cp_async(tmp_path):
    sass = _sass(tmp_path, COPY_SOURCE % {"stages": 3})
    assert "LDGSTS.E.BYPASS.128" in sass and "LDG.E" not in sass


@pytest.mark.parametrize("warps, stages, rows", [(8, 2, 64), (16, 4, 16)])
def test_warp_owned_gemv_has_no_block_barrier_in_its_loop(tmp_path, warps, stages, rows):
    sass = _sass(tmp_path, SOURCE % {"warps": warps, "stages": stages, "rows": rows})
    assert "HMMA.16816.F32" in sass and "LDSM.16.MT88.4" in sass and "LDGSTS.E.BYPASS.128" in sass
    first_barrier = sass.index("BAR.SYNC")
    assert sass.rfind("HMMA") < first_barrier  # every product comes before the first block barrier
    assert len(re.findall(r"BAR\.SYNC", sass)) == 2
    assert "LDL" not in sass and "STL" not in sass
