"""A model's rotary frequencies, computed once on the host in float64 from its ModelConfig.

`inv_freq(cfg)` follows transformers' modeling_rope_utils for every rope type the config reader
accepts (config.py RopeScaling: default, linear, llama3, yarn; plus a GGUF file's per-pair
frequency factors, llama.cpp's form of llama3) and returns the cos/sin scale yarn applies. Qwen's mrope sections need nothing here: with text-only positions the three
sections rotate by the same position, which is 1-D RoPE over the rotary dims.

`rope_table(cfg)` packs both into the fp32 table [3, rotary_dim/2] the rope ops read
(ops/cpu.py `rope`, kernels/attention/rope.py):
- rows HI and LO: inv_freq = hi + lo, a float64 value split in two floats so that 48 bits
  survive the fp32 weight upload (an fp32 inv_freq alone is off by up to 6e-8 relative, i.e.
  0.016 rad at position 262143);
- row AMPLITUDE: the cos/sin scale (1, or yarn's attention factor), repeated per pair.
The angle is position * (hi + lo) in float64. Knows nothing about devices or kernels.
"""
from __future__ import annotations

import math

import numpy as np

from ..config import ModelConfig, RopeScaling

HI, LO, AMPLITUDE = 0, 1, 2          # the table's rows
TABLE_ROWS = 3


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _llama3(freq: np.ndarray, s: RopeScaling) -> np.ndarray:
    """Llama 3.1: low frequencies divided by `factor`, high ones kept, a smooth ramp between."""
    old = s.original_max_position_embeddings
    low_wavelen, high_wavelen = old / s.low_freq_factor, old / s.high_freq_factor
    wavelen = 2 * math.pi / freq
    scaled = np.where(wavelen > low_wavelen, freq / s.factor, freq)
    smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled)


def _yarn(freq: np.ndarray, s: RopeScaling, dim: int, base: float) -> tuple[np.ndarray, float]:
    """YaRN: interpolated (freq / factor) below the ramp, extrapolated (freq) above it, and
    cos/sin scaled by the attention factor."""
    attention = s.attention_factor
    if attention is None:
        if s.mscale and s.mscale_all_dim:
            attention = _yarn_mscale(s.factor, s.mscale) / _yarn_mscale(s.factor, s.mscale_all_dim)
        else:
            attention = _yarn_mscale(s.factor)

    def correction_dim(rotations: float) -> float:
        original = s.original_max_position_embeddings
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001                                     # as transformers: no zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    extrapolation = 1.0 - ramp
    return (freq / s.factor) * (1.0 - extrapolation) + freq * extrapolation, float(attention)


def inv_freq(cfg: ModelConfig) -> tuple[np.ndarray, float]:
    """(inverse frequencies [rotary_dim/2] float64, cos/sin amplitude) of cfg's RoPE."""
    dim, base, s = cfg.rotary_dim, cfg.rope_theta, cfg.rope_scaling
    freq = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    if s.freq_factors:                                   # GGUF rope_freqs, on the plain frequencies
        freq = freq / np.asarray(s.freq_factors, dtype=np.float64)
    if s.rope_type == "default":
        return freq, 1.0
    if s.rope_type == "linear":
        return freq / s.factor, 1.0
    if s.rope_type == "llama3":
        return _llama3(freq, s), 1.0
    if s.rope_type == "yarn":
        return _yarn(freq, s, dim, base)
    raise AssertionError(f"rope_type {s.rope_type!r} passed config.py but has no formula")


def pack_table(freq: np.ndarray, amplitude: float) -> np.ndarray:
    """The fp32 table [3, len(freq)] of float64 frequencies and an amplitude (see above)."""
    freq = np.asarray(freq, dtype=np.float64)
    hi = freq.astype(np.float32)
    lo = (freq - hi.astype(np.float64)).astype(np.float32)
    return np.stack([hi, lo, np.full_like(hi, amplitude)])


def rope_table(cfg: ModelConfig) -> np.ndarray:
    """cfg's rotary table [3, rotary_dim/2] fp32: inv_freq as hi + lo, and the amplitude."""
    return pack_table(*inv_freq(cfg))


def table_inv_freq(table: np.ndarray) -> np.ndarray:
    """The float64 inverse frequencies [rotary_dim/2] a host table holds."""
    return table[HI].astype(np.float64) + table[LO].astype(np.float64)


def plain_table(rotary_dim: int, theta: float) -> np.ndarray:
    """The table of unscaled RoPE (rope_type default) for rotary_dim dims and base theta."""
    return pack_table(1.0 / (theta ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)), 1.0)
