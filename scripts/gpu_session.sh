#!/usr/bin/env bash
# One GPU session in three device calls of < 10 minutes each (carry [".whl"] on each; the
# machine stays warm between calls, so /tmp/site and the numba cache are reused):
#   bash scripts/gpu_session.sh check     GPU tests: kernels, runtime, whole tiny models
#   bash scripts/gpu_session.sh bench27   bench --random qwen3.6-27b, prompts 512 and 8192, profile
#   bash scripts/gpu_session.sh bench35   the same for qwen3.6-35b-a3b
# Logs and JSON land in $OUT. Try kernel choices with BENCH_ARGS="--gemm mma" or "--attention mma".
# The benches run the transformers peer first (same preset shapes, random weights); PEER=0 skips it
# if the call gets close to its 10-minute limit.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 NUMBA_CUDA_ARRAY_INTERFACE_SYNC=0 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
bench() {
  python3 -m ninfer_nb bench --random "$1" --prompt-len 512,8192 --gen 64 --prefill-chunk 2048 \
    --profile --json "$OUT/$2.json" $([ "${PEER:-1}" = 1 ] && echo --peer hf) ${BENCH_ARGS:-} 2>&1 | grep -v "^loading" | tee "$OUT/$2.log"
}
case "${1:-check}" in
  check)
    python3 -m pytest -m gpu -q -p no:cacheprovider --durations=15 --junitxml="$OUT/junit.xml" \
      tests/kernels tests/runtime tests/engine/test_gpu_model.py 2>&1 | tee "$OUT/pytest_gpu.log"
    echo "pytest exit code: ${PIPESTATUS[0]}" ;;
  bench27) bench qwen3.6-27b bench27 ;;
  bench35) bench qwen3.6-35b-a3b bench35 ;;
  *) echo "usage: $0 check|bench27|bench35" >&2; exit 2 ;;
esac
