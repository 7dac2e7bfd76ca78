"""Skip `gpu`-marked tests when no CUDA device is usable."""
from __future__ import annotations

import pytest

from ninfer_nb.runtime.device import cuda_available


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
