"""Dense matmul kernels: the decode GEMVs and SIMT GEMM (linear.py), the tensor-core prefill
GEMMs (gemm_mma.py: mma.sync, cc >= 8.0; gemm_wgmma.py: wgmma, cc 9.0)."""
