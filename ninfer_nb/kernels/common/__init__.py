"""Code every kernel family shares: inline PTX (ptx.py) and its simulator stand-ins (ptx_sim.py),
warp reductions, bf16 bit casts, Numba array types, and the kernel registry."""
