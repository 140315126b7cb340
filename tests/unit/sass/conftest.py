"""pytest fixtures of the SASS-tuner tests."""

from __future__ import annotations

import pytest
from sass_fixtures import FIXTURE_KERNELS, fixture_kernel

from mirage.sass.kernel import Kernel


@pytest.fixture(params=FIXTURE_KERNELS, ids=lambda row: f"{row[0]}:{row[1] or 'first'}")
def any_kernel(request: pytest.FixtureRequest) -> Kernel:
    return fixture_kernel(*request.param)


@pytest.fixture
def elementwise_x4() -> Kernel:
    return fixture_kernel("elementwise.cubin", "scaled_add_x4")


@pytest.fixture
def cute_gemm() -> Kernel:
    return fixture_kernel("cute_gemm.cubin", "cute_gemm_tn")
