"""Attention over narrow heads on the GPU (head dims of no whole 16: Stable Diffusion 1.5's 40): the
µGraphs of benchmarks/mugraphs/narrow_heads.py checked against float64 and timed (CUDA-graph replays,
median µs a call) beside SDPA on the same inputs. Writes narrow_heads_<date>.json into ``--out``."""

from __future__ import annotations


def main(argv=None) -> None:
    from benchmarks.mugraphs.narrow_heads import GRAPHS
    from benchmarks.padded_products import time_collection
    from benchmarks.stream_floor import program_arguments

    time_collection(GRAPHS, "narrow_heads", program_arguments(__doc__, argv))


if __name__ == "__main__":
    main()
