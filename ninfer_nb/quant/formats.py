"""The quantized weight formats the engine knows, described by value (no arrays here).

The canonical layout is the project's own groupwise integer format, the one other integer
formats (GPTQ, AWQ, GGUF's Q4_0 / Q8_0 ...) are meant to be repacked into. For a logical
matrix [N, K] (an expert stack adds a leading E axis to every array):

- `codes`:  uint8 [N, K] for 8 bits; uint8 [N, K / 2] for 4 bits, column 2j in the low
            nibble and 2j + 1 in the high nibble of byte j. Codes are unsigned, 0 .. 2^bits - 1.
- `scales`: float16 [N, K / group_size], one per group of `group_size` consecutive columns.
- `zeros`:  uint8 [N, K / group_size] (only formats with zero points), 0 .. 2^bits - 1.

A weight is w = scale * (code - zero), zero = the group's zero point, or 2^(bits - 1) (128 for
8 bits, 8 for 4 bits) in the symmetric formats.

Two more layouts hold checkpoint formats that do not map onto the canonical one exactly:

- "groupwise-min" (`int4-g32-min`, GGUF Q4_1): `codes` and fp16 `scales` as above plus fp16
  `mins` [N, K / group_size]; w = scale * code + min (float32 arithmetic, so it equals the
  `gguf` package's dequantization bit for bit).
- "fp8-block" (`fp8`, Hugging Face FP8 checkpoints with 128 x 128 block scales): `codes` uint8
  [N, K] = the float8 e4m3fn bit patterns, `scales` float32 [ceil(N / 128), ceil(K / 128)];
  w = e4m3(code) * scale[n // 128, k // 128] (the checkpoint's `weight_scale_inv`: a
  multiplier despite its name).

Knows nothing about how arrays are stored on a device or which kernels read them.
"""
from __future__ import annotations

from dataclasses import dataclass

GROUP_SIZES = (32, 64, 128)


@dataclass(frozen=True)
class QuantFormat:
    """One quantized format. `layout` names the array layout ops dispatch on ("groupwise":
    the canonical layout above); `arrays` are the names of the arrays a weight of it holds."""

    name: str                      # e.g. "int4-g64", "int8-g128-zp", "int4-g32-min", "fp8"
    layout: str                    # "groupwise" | "groupwise-min" | "fp8-block"
    bits: int                      # bits per code
    group_size: int                # columns sharing one scale (and zero point)
    zero_points: bool = False      # per-group zero points stored (asymmetric)
    scale_bits: int = 16           # float16 scales (fp8-block: float32)

    @property
    def arrays(self) -> tuple[str, ...]:
        if self.layout == "groupwise-min":
            return ("codes", "scales", "mins")
        return ("codes", "scales", "zeros") if self.zero_points else ("codes", "scales")

    @property
    def bytes_per_weight(self) -> float:
        """Stored bytes per logical weight, scales, mins and zero points included."""
        if self.layout == "fp8-block":
            return 1.0 + self.scale_bits / 8 / (self.group_size * self.group_size)
        per_group = self.scale_bits / 8 + (1 if self.zero_points else 0)
        if self.layout == "groupwise-min":
            per_group += self.scale_bits / 8
        return self.bits / 8 + per_group / self.group_size

    @property
    def midpoint(self) -> int:
        """The implicit zero point of the symmetric formats."""
        return 1 << (self.bits - 1)

    @property
    def max_code(self) -> int:
        return (1 << self.bits) - 1


def groupwise(bits: int, group_size: int, zero_points: bool = False) -> QuantFormat:
    if bits not in (4, 8):
        raise ValueError(f"groupwise formats have 4 or 8 bits, not {bits}")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group size must be one of {GROUP_SIZES}, not {group_size}")
    name = f"int{bits}-g{group_size}" + ("-zp" if zero_points else "")
    return QuantFormat(name=name, layout="groupwise", bits=bits, group_size=group_size,
                       zero_points=zero_points)


INT4_G32_MIN = QuantFormat(name="int4-g32-min", layout="groupwise-min", bits=4, group_size=32)
FP8_BLOCK = QuantFormat(name="fp8", layout="fp8-block", bits=8, group_size=128, scale_bits=32)

FORMATS: dict[str, QuantFormat] = {
    f.name: f for f in (groupwise(b, g, z) for b in (4, 8) for g in GROUP_SIZES for z in (False, True))
}
FORMATS |= {INT4_G32_MIN.name: INT4_G32_MIN, FP8_BLOCK.name: FP8_BLOCK}


def quant_format(name: str) -> QuantFormat:
    """The format called `name` (e.g. "int4-g64"); ValueError naming the known ones."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown weight format {name!r} (known: {', '.join(FORMATS)})") from None
