"""Quantized weight formats: their descriptions (`formats`) and the NumPy reference that
quantizes and dequantizes them (`dequant`). Knows nothing about models or devices."""
