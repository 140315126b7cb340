"""The combine kernel's shapes in the attention families: the exploration's family of every shape
(``family(case, combine=True)``) and the tuned members that carry a shape of their own
(``ATTENTION_SPLITS``' sixth field, ``combine_threads``)."""

from __future__ import annotations

import pytest

from benchmarks.variants import family, interpreted_error


def _combine(graph):
    """The combine's block graph: grid and threads."""
    block = graph.block_graphs()[-1]
    return block.grid_dim, block.block_dim[0]


def test_the_combine_family_holds_every_shape_of_each_split_once():
    members = family("gqa_b1", combine=True)
    labels = [v.label for v, _ in members]
    assert len(labels) == len(set(labels))
    pick = [v for v in labels if v.startswith("kv_splits=16,q_splits=4,iters=2,threads=128,")]
    # 2-64 rows a block times 64-512 threads, less the three where threads outnumber the elements
    assert len(pick) == 21
    assert not any("combine_rows=2,combine_threads=256" in v or "combine_rows=4,combine_threads=512" in v
                   for v in labels)


@pytest.mark.parametrize("case, label, grid, threads", [
    ("gqa_b1", "kv_splits=16,q_splits=4,iters=2,threads=128,row_sums=True,combine_rows=4,combine_threads=128",
     (2, 64, 1), 128),
    ("gqa_b8", "kv_splits=4,q_splits=2,iters=8,threads=256,row_sums=True,combine_rows=32,combine_threads=512",
     (16, 8, 1), 512),
])
def test_tuned_members_with_a_combine_shape_compute_the_reference(case, label, grid, threads):
    """The tuned family keeps the shapes that measured fastest; each member is the function (float64
    interpretation against the reference) with a combine of that many blocks and threads."""
    members = dict((v.label, g) for v, g in family(case))
    graph = members[label]
    assert _combine(graph) == (grid, threads)
    assert interpreted_error(case, graph) <= 1e-9


def test_the_norm_family_shapes_qknorm_key_kernel_and_computes_the_reference():
    """``family(case, norm=True)``: each QKNorm split with a key kernel, in 16-128 blocks a head and
    64-512 threads; the key kernel is the program's first and carries the shape, and a member is
    still the function."""
    members = dict((v.label, g) for v, g in family("qknorm_b1", norm=True))
    assert len(members) == 16 * 6  # five normalize_k splits and one key_sums split
    label = ("kv_splits=4,q_splits=4,iters=8,threads=128,row_sums=True,combine_rows=8,normalize_k=True,"
             "norm_blocks=16,norm_threads=512")
    graph = members[label]
    key_kernel = graph.block_graphs()[0]
    assert (key_kernel.grid_dim, key_kernel.block_dim[0]) == ((2, 16, 1), 512)
    assert interpreted_error("qknorm_b1", graph) <= 1e-9
    sums = next(g for v, g in members.items() if "key_sums=True" in v and "norm_threads=64" in v)
    assert sums.block_graphs()[0].block_dim[0] == 64
    assert family("gqa_b1", norm=True) == family("gqa_b1")  # GQA has no key kernel: its tuned family


def test_tuned_qknorm_members_carry_their_key_kernel_shape():
    """The tuned family's members with a key kernel of their own shape (``NORMALIZE_K_32``,
    ``NORMALIZE_K_64_64``) build that kernel with those blocks and threads, and compute the function."""
    members = dict((v.label, g) for v, g in family("qknorm_b1"))
    shapes = {label: (g.block_graphs()[0].grid_dim, g.block_graphs()[0].block_dim[0])
              for label, g in members.items() if "combine_threads=512" in label and "normalize_k" in label}
    assert sorted(shapes.values()) == [((2, 32, 1), 128), ((2, 64, 1), 64), ((2, 64, 1), 128)]
    label = next(label for label, shape in shapes.items() if shape == ((2, 64, 1), 64))
    assert interpreted_error("qknorm_b1", members[label]) <= 1e-9
