"""Numba array types used in kernel signatures (C-contiguous)."""
from numba import float32, float64, int8, int32, int64, uint16, uint32

f32 = float32
f64 = float64
i32 = int32
i64 = int64
u32 = uint32
f32_1 = float32[::1]
f32_2 = float32[:, ::1]
f32_3 = float32[:, :, ::1]
f32_4 = float32[:, :, :, ::1]
u16_1 = uint16[::1]
u16_2 = uint16[:, ::1]
u16_3 = uint16[:, :, ::1]
i32_1 = int32[::1]
i32_2 = int32[:, ::1]
i64_1 = int64[::1]
i8_3 = int8[:, :, ::1]
