#!/usr/bin/env bash
# One GPU session: bash dev/gpu_session.sh MODE, run from the repository root on the GPU machine,
# with the wheels the GPU image lacks in .whl/ (git-ignored; see dev/README.md). Logs and JSON
# land in $OUT. MODE (each fits one call of < 10 minutes):
#   check     GPU tests: kernels, runtime, whole tiny models, the server on the GPU
#   bench27   bench --random qwen3.6-27b, prompts 512 and 8192, profile (PEER=0: no transformers peer;
#             BENCH_ARGS: extra bench flags)
#   bench35   the same for qwen3.6-35b-a3b
#   argmax    device argmax (the default) vs --host-argmax: GPU test, 35B A/B
#   moe       MoE decode: router / expert kernel GPU tests, route + MoE probes, 35B A/B
#   mma       decode attention, tensor cores vs SIMT: GPU tests (times), A/B benches
#   ncu       Nsight Compute on decode attention (8K keys) and the MoE kernels: stalls
#   gemv      decode GEMV builds: GPU tests, dev/gemv_probe.py, A/B benches (MODELS, REPS, EXP)
#   chain     dev/chain_probe.py: the 27B GDN layer's GEMVs in model order, per build variant
#   ahead     tokens picked in the decode graph, steps queued ahead: GPU tests, greedy / sampled
#             decode (MODELS, REPS, EXTRA="--no-decode-ahead" for that A/B)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target /tmp/site .whl/*.whl || exit 1
export NINFER_REQUIRE_GPU=1 PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 NUMBA_CUDA_ARRAY_INTERFACE_SYNC=0 TOKENIZERS_PARALLELISM=false
ln -sfn ../server ninfer_nb/server; ln -sfn ../tui ninfer_nb/tui   # ninfer_nb.server / .tui without installing
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
bench() {
  python3 -m ninfer_nb bench --random "$1" --prompt-len 512,8192 --gen 64 --prefill-chunk 2048 \
    --profile --json "$OUT/$2.json" $([ "${PEER:-1}" = 1 ] && echo --peer hf) ${BENCH_ARGS:-} 2>&1 | grep -v "^loading" | tee "$OUT/$2.log"
}
if [ -f /tmp/m/a ] && [ -f /tmp/m/b ] && [ -f .mc/part ]; then
  export NINFER_CACHE=/tmp/cache; mkdir -p /tmp/cache/models
  cat /tmp/m/a /tmp/m/b .mc/part > /tmp/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
fi
case "${1:-check}" in
  check)
    python3 -m pytest -m gpu -q -s -p no:cacheprovider --durations=15 --junitxml="$OUT/junit.xml" \
      tests/kernels tests/runtime tests/engine/test_gpu_model.py tests/engine/test_gpu_server.py > "$OUT/pytest_gpu.log" 2>&1
    rc=$?
    # the timing lines the tests print (-s): kernel vs kernel, TFLOP/s, GB/s
    grep -E "prefill attention|decode attention|GEMV |MoE decode|MoE router|gated delta rule|GDN decode middle|gated rms norm|row elementwise|grouped mma|TFLOP|max error|TTFT|host time per launch" "$OUT/pytest_gpu.log" \
      | tee "$OUT/timings.txt"
    grep -E "passed|failed|FAILED|Error" "$OUT/pytest_gpu.log" | tail -30
    echo "pytest exit code: $rc" ;;
  argmax)                 # EngineConfig.device_argmax: its GPU test, then alternating 35B decode runs
    python3 -m pytest -m gpu -q -p no:cacheprovider tests/engine/test_gpu_model.py -k device_argmax 2>&1 | tail -3
    for i in 1 2 3; do for flag in --host-argmax ""; do
      python3 -m ninfer_nb bench --random qwen3.6-35b-a3b --prompt-len 512 --gen 64 $flag 2>&1 \
        | grep -E "^ninfer_nb +512" | sed "s/^/${flag:-device-argmax} /"
    done; done ;;
  moe)                    # the MoE decode kernels: GPU tests, then where the block's time goes
    python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_cases_moe.py tests/kernels/test_moe.py \
      -k "moe_router or moe_route or moe_normed or moe_experts" 2>&1 | tail -2
    python3 dev/route_probe.py 2>&1 | grep -E "cycles|ids"
    python3 dev/moe_probe.py 2>&1
    for i in 1 2; do
      python3 -m ninfer_nb bench --random qwen3.6-35b-a3b --prompt-len 512,8192 --gen 64 2>&1 | grep -E "^ninfer_nb "
    done ;;
  mma)                    # decode attention on tensor cores (bf16 caches): GPU tests (times vs SIMT), A/B benches
    python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/kernels/test_cases_attention.py \
      -k "decode_attention_mma or attention_decode_splits or attention_gated" 2>&1 \
      | grep -E "decode attention|passed|failed|Error|error"
    for m in qwen3.6-35b-a3b qwen3.6-27b; do for flag in "--kv-cache fp32" "--kv-cache bf16 --decode-attention simt" "--kv-cache bf16"; do
      python3 -m ninfer_nb bench --random $m --prompt-len 512,8192 --gen 64 $flag 2>&1 \
        | grep -E "^ninfer_nb |Error|error" | sed "s/^/$m $flag /"
    done; done ;;
  ncu)                    # where the decode attention and MoE kernels wait (35B shapes, 8K keys; ncu's report in $OUT)
    NCU="ncu --clock-control none --section SpeedOfLight --section LaunchStats --section Occupancy
      --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis
      --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
    $NCU -k regex:attn_split_kernel --launch-skip 2 --launch-count 4 \
      python3 dev/attn_probe.py --eager > "$OUT/ncu_attn.txt" 2>&1
    $NCU -k "regex:moe_gate_up_wide|moe_down_wide|moe_router_cluster" --launch-count 4 \
      python3 dev/moe_probe.py --eager --layers 1 > "$OUT/ncu_moe.txt" 2>&1
    for f in "$OUT"/ncu_attn.txt "$OUT"/ncu_moe.txt; do
      grep -E "^  [a-z_]+\[|Duration|Registers Per|Achieved Occupancy|L2 Hit|DRAM Through|L2 Cache Through|L1/TEX Cache Through|Issued Warp|Eligible Warps|stalled.*ratio +[0-9.]*[1-9]" "$f" \
        | grep -vE "ratio +0\.0[0-9]*$" | sed -E "s/\[v[0-9]+,[^]]*\]\(.*\)//" | head -120
    done
    python3 dev/attn_probe.py; python3 dev/attn_probe.py --hq 24 --hkv 4 ;;
  gemv)                   # the decode GEMV builds: GPU tests, per-shape probe, then alternating A/B benches
    if [ "${PROBE:-1}" = 1 ]; then
      python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_cases_linear.py \
        -k "gemv_one_token or gemv_multi_token" 2>&1 | tail -2
      python3 dev/gemv_probe.py 2>&1
    fi
    for m in ${MODELS:-qwen3.6-35b-a3b}; do for i in $(seq ${REPS:-2}); do for e in "" ${EXP:-}; do
      python3 -m ninfer_nb bench --random $m --prompt-len ${PROMPTS:-512,8192} --gen 64 ${e:+--experimental $e} 2>&1 \
        | grep -E "^ninfer_nb |Error|error" | sed "s/^/$m ${e:-default} /"
    done; done; done ;;
  chain)                  # dev/chain_probe.py: us per layer by build variant
    python3 dev/chain_probe.py ${CHAIN_ARGS:-} 2>&1 | tee "$OUT/chain.log" ;;
  ahead)                  # tokens picked in the decode graph, steps queued ahead: GPU tests, then greedy,
                          # device-sampled (T = 0.7) and host-sampled decode (EXTRA: more A/B flags)
    python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/kernels/test_sampling.py \
      2>&1 | grep -E "argmax of|passed|failed|Error|assert" | head -20
    python3 -m pytest -m gpu -q -p no:cacheprovider tests/engine/test_gpu_model.py tests/engine/test_gpu_server.py \
      -k "not smollm and not cli_paris" 2>&1 | grep -E "passed|failed|Error|assert" | head -20
    for m in ${MODELS:-qwen3.6-35b-a3b qwen3.6-27b}; do for i in $(seq ${REPS:-1}); do
      for flag in "" "--temperature 0.7" "--temperature 0.7 --host-argmax" ${EXTRA:-}; do
        python3 -m ninfer_nb bench --random $m --prompt-len 512 --gen 64 $flag 2>&1 \
          | grep -E "^ninfer_nb |Error|error" | sed "s/^/$m ${flag:-greedy} /"
      done; done; done ;;
  bench27) bench qwen3.6-27b bench27 ;;
  bench35) bench qwen3.6-35b-a3b bench35 ;;
  *) echo "usage: $0 check|bench27|bench35|argmax|moe|mma|ncu|gemv|chain|ahead" >&2; exit 2 ;;
esac
