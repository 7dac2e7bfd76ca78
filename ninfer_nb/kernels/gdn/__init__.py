"""Gated DeltaNet kernels: causal conv1d (conv1d.py), gates and the recurrent rule (gdn.py), the
fused decode step (gdn_decode.py), the chunked WY form (gdn_chunked.py) and its tensor-core state
pass and prepare kernels (gdn_chunked_mma.py, gdn_prepare_mma.py)."""
