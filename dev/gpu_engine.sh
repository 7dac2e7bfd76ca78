#!/usr/bin/env bash
# GPU run of the whole engine: kernel/runtime tests, whole-model GPU tests, and (when the
# default model is present under $NINFER_CACHE) the SmolLM2 checks and the benchmark.
#   bash dev/gpu_engine.sh [extra pytest args]     (wheels in .whl/, see dev/README.md)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export NINFER_REQUIRE_GPU=1 PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 NUMBA_CUDA_ARRAY_INTERFACE_SYNC=0 TOKENIZERS_PARALLELISM=false
ln -sfn ../server ninfer_nb/server; ln -sfn ../tui ninfer_nb/tui   # ninfer_nb.server / .tui without installing
export NINFER_CACHE=${NINFER_CACHE:-/root/ninfer_cache}
python3 -m pytest -m gpu -q -p no:cacheprovider --durations=10 "$@" 2>&1 | tee "$OUT/pytest_gpu.log"
echo "pytest exit code: ${PIPESTATUS[0]}"
