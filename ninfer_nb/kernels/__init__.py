"""Numba CUDA kernels, one op family per module; no model knowledge.

bf16 is stored as uint16 and bit-cast (kernels/bf16.py); inline PTX lives in kernels/ptx.py;
every kernel is listed in kernels/registry.py with its explicit signatures.
"""
