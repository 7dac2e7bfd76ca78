"""Mixture-of-experts kernels: router and per-pair decode experts (moe.py), prefill grouped by
expert (moe_grouped.py) and its pipelined tensor-core GEMMs (moe_pipelined.py, moe_wgmma.py)."""
