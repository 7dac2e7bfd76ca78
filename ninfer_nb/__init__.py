"""ninfer_nb: Qwen3.5/3.6 hybrid-model inference in Python (Numba CUDA kernels, NumPy reference)."""
from __future__ import annotations

from .params import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str):  # lazy: importing the package must not load numba or tokenizers
    if name == "LLM":
        from .llm import LLM

        return LLM
    raise AttributeError(name)
