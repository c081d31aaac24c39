#!/usr/bin/env bash
# Tests and benchmarks of the cuda backend on a GPU machine with no package index, in one go.
#
# Prepare here (builds the Atlas wheels and fetches the missing dependencies into .whl/):
#     bash plugins/gb10/scripts/prepare_wheels.sh
# then run on the GPU machine from the repository root, with OUT set to a folder for the logs:
#     bash plugins/gb10/scripts/device_check.sh STAGE...
# Stages: tests, models, latency, ttft, throughput, peer, coldstart (any order, any subset).
set -u
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/atlas-device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATLAS_KERNEL_CACHE=${ATLAS_KERNEL_CACHE:-/tmp/atlas-kernels} HF_HUB_OFFLINE=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
PEAK=${PEAK_GFLOPS:-790000}  # bf16 dense matrix rate measured on this workplace's H100s (KINDS.md)

bench() {  # bench LOGNAME LIMIT_S ARGS...
    local name=$1 limit=$2; shift 2
    echo "== atlas bench $*" | tee -a "$OUT/bench.log"
    timeout "$limit" python3 -m atlas_core.cli bench "$@" --backend cuda --peak-gflops "$PEAK" 2>&1 | tee "$OUT/$name.log" | grep -v "^engine config" >> "$OUT/bench.log"
}

for stage in "$@"; do
    start=$(date +%s)
    case $stage in
        tests)
            timeout 150 python3 -m pytest -q -p no:cacheprovider -rs tests/test_conformance_*.py -k cuda plugins/gb10/tests/test_cuda_kernels.py plugins/gb10/tests/test_cuda_products.py 2>&1 | tee "$OUT/tests.log" | tail -30 ;;
        models)
            timeout 230 python3 -m pytest -q -p no:cacheprovider -rs plugins/gb10/tests/test_cuda_models.py 2>&1 | tee "$OUT/models.log" | tail -30 ;;
        latency)
            bench latency_qwen3 120 latency --random-weights qwen3-0.6b
            bench latency_llama 170 latency --random-weights llama-3-8b ;;
        ttft)
            bench ttft_qwen3 200 latency --random-weights qwen3-0.6b --prompt-len 1024 --tokens 2
            bench ttft8k_qwen3 200 latency --random-weights qwen3-0.6b --prompt-len 8192 --tokens 2 --max-seq-len 8200
            bench ttft_llama 300 latency --random-weights llama-3-8b --prompt-len 1024 --tokens 2
            bench ttft8k_llama 300 latency --random-weights llama-3-8b --prompt-len 8000 --tokens 2 ;;
        throughput)
            bench throughput_qwen3 500 throughput --random-weights qwen3-0.6b --max-num-seqs 256 ;;
        peer)
            for model in qwen3-0.6b llama-3-8b; do
                timeout 300 python3 plugins/gb10/scripts/hf_peer.py "$model" 2>&1 | tail -3 | tee -a "$OUT/peer.log"
            done ;;
        coldstart)
            for model in ""; do
                timeout 200 python3 plugins/gb10/scripts/cold_start.py $model 2>&1 | tail -3 | tee -a "$OUT/coldstart.log"
            done ;;
        profile)
            timeout 200 python3 plugins/gb10/scripts/profile_decode.py qwen3-0.6b llama-3-8b 2>&1 | tr "\r" "\n" | grep -v "loading layers" | tee "$OUT/profile.log" ;;
        kernels)
            for model in qwen3-0.6b llama-3-8b; do
                timeout 200 ncu --clock-control none --profile-from-start off --csv --metrics gpu__time_duration.sum \
                    python3 plugins/gb10/scripts/graph_kernels.py "$model" > "$OUT/ncu_$model.csv" 2> "$OUT/ncu_$model.err"
                echo "== $model" | tee -a "$OUT/kernels.log"
                python3 plugins/gb10/scripts/graph_kernels.py --summarize "$OUT/ncu_$model.csv" | tee -a "$OUT/kernels.log"
            done ;;
        *) echo "unknown stage $stage" ;;
    esac
    echo "stage $stage: $(( $(date +%s) - start )) s" | tee -a "$OUT/stages.log"
done
grep -E "^(decode|roofline|prefill|throughput|ceiling|== )" "$OUT/bench.log" 2>/dev/null | cut -c1-220
