"""Causal GQA attention kernels: KV-cache store, decode split/combine and SIMT prefill
(attention.py), tensor-core decode (attention_decode_mma.py), flash prefill (attention_flash.py),
prefill through the GEMMs (attention_gemm.py), int8 cache codes (kvquant.py), RoPE (rope.py)."""
