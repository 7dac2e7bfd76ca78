"""Where the model runs: the `Backend` contract (base.py) that the CPU and CUDA backends implement."""
from __future__ import annotations

from .base import Backend, Forward, Pick

__all__ = ["Backend", "Forward", "Pick"]
