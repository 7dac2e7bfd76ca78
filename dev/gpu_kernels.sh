#!/usr/bin/env bash
# GPU kernel + runtime tests alone, logs under $OUT: install the carried wheels (.whl/, see
# dev/README.md), then pytest -m gpu on tests/kernels and tests/runtime.
#   bash dev/gpu_kernels.sh [extra pytest args]
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export NINFER_REQUIRE_GPU=1 PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 NUMBA_CUDA_ARRAY_INTERFACE_SYNC=0
ln -sfn ../server ninfer_nb/server; ln -sfn ../tui ninfer_nb/tui   # ninfer_nb.server / .tui without installing
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import numpy, numba, numba.cuda; print('numpy', numpy.__version__, 'numba', numba.__version__)" | tee -a "$OUT/gpu.txt"
python3 -m pytest -m gpu tests/kernels tests/runtime -q -p no:cacheprovider --durations=15 \
  --junitxml="$OUT/junit.xml" "$@" 2>&1 | tee "$OUT/pytest.log"
rc=${PIPESTATUS[0]}
echo "pytest exit code: $rc" | tee -a "$OUT/pytest.log"
exit "$rc"
