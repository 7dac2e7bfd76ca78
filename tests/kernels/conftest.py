"""Skip `gpu`-marked tests when no CUDA device is usable; `dev`: the device a family test module
(tests/kernels/test_<family>.py) runs its cases on, the simulator or the GPU (device.py)."""
from __future__ import annotations

from typing import Any

import pytest

from ninfer_nb.runtime.device import cuda_available


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def dev() -> Any:
    from tests.kernels.device import make_device

    return make_device()


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> Any:
    """A generator seeded by the test's name: every case draws the same inputs on every run."""
    import zlib

    import numpy as np

    return np.random.default_rng(zlib.crc32(request.node.name.encode()))
