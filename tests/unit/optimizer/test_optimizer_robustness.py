"""Optimizer options outside what the hardware can run are refused when they are made, not compiled into
kernels that fail at launch."""

from __future__ import annotations

import pytest

from mirage.optimizer import OptimizerOptions
from mirage.optimizer.cluster_fold import MAX_CLUSTER


@pytest.mark.parametrize("name", ["max_cluster", "multicast_cluster"])
@pytest.mark.parametrize("value", [MAX_CLUSTER + 1, 32, 64, -1, 2.0, True])
def test_cluster_sizes_beyond_the_hardware_are_refused(name, value):
    with pytest.raises(ValueError, match=f"{name}={value!r}: a thread-block cluster has at most 16 blocks"):
        OptimizerOptions(**{name: value})


@pytest.mark.parametrize("value", [0, 1, 2, 8, MAX_CLUSTER])
def test_cluster_sizes_the_hardware_runs_are_accepted(value):
    options = OptimizerOptions(max_cluster=value, multicast_cluster=value)
    assert options.max_cluster == options.multicast_cluster == value
