"""Numba CUDA kernels grouped by op family (linear/, attention/, gdn/, moe/, and single-module
families: norm, elementwise, embedding, sampling, random_fill); no model knowledge.

common/ holds what the families share: bf16 stored as uint16 and bit-cast (bf16.py), inline PTX
(ptx.py), and the registry listing every kernel with its explicit signatures (registry.py).
"""
