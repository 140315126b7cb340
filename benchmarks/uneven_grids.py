"""Uneven grids on the GPU (``BlockGraph.spans``): the µGraphs of benchmarks/mugraphs/uneven.py (ViT's
197 tokens, CLIP's 77) checked against float64 and timed (CUDA-graph replays, median µs a call) beside
PyTorch on the same inputs. Writes uneven_grids_<date>.json into ``--out``."""

from __future__ import annotations


def main(argv=None) -> None:
    from benchmarks.mugraphs.uneven import GRAPHS
    from benchmarks.padded_products import time_collection
    from benchmarks.stream_floor import program_arguments

    time_collection(GRAPHS, "uneven_grids", program_arguments(__doc__, argv))


if __name__ == "__main__":
    main()
