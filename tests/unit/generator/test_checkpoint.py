"""Checkpoints: a search killed mid-way resumes from its checkpoint and ends with the same results."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mirage as mi
from mirage.generator import StopReason, search
from mirage.generator.checkpoint import Checkpoint

ROOT = Path(__file__).resolve().parents[3]
SPACE = {
    "griddims": [(4, 1, 1)],
    "franges": [4],
    "kernel_ops": ["matmul", "exp"],
    "block_ops": ["matmul", "exp", "accum", "accum_sum"],
    "max_block_ops": 5,
    "max_kernel_ops": 5,
}

SCRIPT = """
import json, sys
import mirage as mi
from mirage.generator import search
g = mi.new_kernel_graph("tiny")
x = g.new_input(dims=(8, 64), dtype=mi.float16)
w = g.new_input(dims=(64, 32), dtype=mi.float16)
g.mark_output(g.exp(g.matmul(x, w)))
search(g.freeze(), workers=1, progress=False, cache=False, checkpoint=sys.argv[1], checkpoint_every_s=0,
       **json.loads(sys.argv[2]))
"""


def reference():
    g = mi.new_kernel_graph("tiny")
    x = g.new_input(dims=(8, 64), dtype=mi.float16)
    w = g.new_input(dims=(64, 32), dtype=mi.float16)
    g.mark_output(g.exp(g.matmul(x, w)))
    return g.freeze()


def _done_units(path: Path) -> int:
    try:
        return len(json.loads(path.read_text())["done"])
    except (OSError, ValueError, KeyError):
        return 0


def test_killed_search_resumes_with_the_same_result_set(tmp_path):
    path = tmp_path / "search.ckpt.json"
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "MIRAGE_CACHE_DIR": str(tmp_path / "cache")}
    process = subprocess.Popen([sys.executable, "-c", SCRIPT, str(path), json.dumps(SPACE)], env=environment)
    try:
        deadline = time.time() + 120
        while _done_units(path) < 5 and process.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        assert process.poll() is None, "the search finished before it could be killed"
        process.send_signal(signal.SIGKILL)
        process.wait()
    finally:
        if process.poll() is None:
            process.kill()
    done = _done_units(path)
    assert done >= 5

    resumed = search(reference(), workers=1, progress=False, cache=False, checkpoint=path, **SPACE)
    assert resumed.stats.units_resumed == done < resumed.stats.units_total
    whole = search(reference(), workers=1, progress=False, cache=False, checkpoint=False, **SPACE)
    assert resumed.stop_reason is whole.stop_reason is StopReason.COMPLETE
    assert resumed.hashes == whole.hashes and len(whole) > 5
    assert resumed.stats.states == whole.stats.states
    assert not path.exists()  # a finished search removes its checkpoint


def test_checkpoint_of_another_search_is_ignored(tmp_path, caplog):
    path = tmp_path / "other.json"
    Checkpoint("some-other-key", 3, {0: {"index": 0}}).save(path)
    assert Checkpoint.load(path, "this-key", 3) is None
    path.write_text("{not json")
    assert Checkpoint.load(path, "this-key", 3) is None
    assert any("ignoring" in r.getMessage() for r in caplog.records)


def test_checkpoint_round_trip(tmp_path):
    path = tmp_path / "c.json"
    record = {"index": 2, "states": 7, "stop": None, "found": [], "stats": {"pruned": {"shape": 3}}}
    Checkpoint("key", 5, {2: record}).save(path)
    loaded = Checkpoint.load(path, "key", 5)
    assert loaded is not None and loaded.done == {2: record}
    assert Checkpoint.load(path, "key", 6) is None  # a different unit list: another search


def two_products():
    g = mi.new_kernel_graph("two_products")
    x = g.new_input(dims=(8, 64), dtype=mi.float16)
    w = g.new_input(dims=(64, 32), dtype=mi.float16)
    v = g.new_input(dims=(32, 16), dtype=mi.float16)
    g.mark_output(g.matmul(g.exp(g.matmul(x, w)), v))
    return g.freeze()


def test_a_search_stopped_by_time_keeps_its_checkpoint(tmp_path):
    path = tmp_path / "timed.json"
    # Mirage's default op sets and grids: a space whose whole search took 10.6 s on a 2-core CPU (the
    # one-product reference's, 1.5 s, came within a one-second budget once its verifications got faster)
    result = search(
        two_products(),
        workers=1,
        progress=False,
        cache=False,
        checkpoint=path,
        time_limit_s=1.0,
        checkpoint_every_s=0,
    )
    assert result.stop_reason is StopReason.TIME and result.stats.units_done > 0
    assert path.exists() and _done_units(path) == result.stats.units_done
