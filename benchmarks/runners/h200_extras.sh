#!/usr/bin/env bash
# On the H200 device (see ../shared/gpu/README.md), after the staging calls, with .gpu/common and
# .bench carried: the one-engine benchmarks on a 1B-shaped dummy-weight model (8B for a cascade's
# second stage). One step per call, each under the device's 10-minute limit:
#   bash benchmarks/runners/h200_extras.sh compile     # compile_cache.py: engine starts cold, restored, warm
#   bash benchmarks/runners/h200_extras.sh labels      # label_decoding.py and confidence.py (A-B / B-A rounds)
#   bash benchmarks/runners/h200_extras.sh trace       # label_step_trace.py: the labeling step's parts, 40,000 rows
#       (TRACE_ARGS="--rounds 2 --before DIR": against another copy, git archive REF | tar -x -C DIR)
#   bash benchmarks/runners/h200_extras.sh cascade     # cascade.py: 1B, 8B and the cascade 1B then 8B
# Result files land in $OUT (default /tmp/out) as h200-<benchmark>.json.
set -euo pipefail
step=${1:?compile, labels, trace or cascade}
bash benchmarks/runners/make_bench_dir.sh
bash .gpu/common/device-install.sh
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}; mkdir -p "$out"
dummy='{"load_format": "dummy"}'
model() { [ -d "/tmp/llama-$1" ] || python3 -m benchmarks.tools.make_dummy_model --shape "$1" --tokenizer .bench/tok --out "/tmp/llama-$1"; }
model 1b
case $step in
  compile)
    python3 -m benchmarks.engine.compile_cache --rounds "${ROUNDS:-1}" --model /tmp/llama-1b \
        --resource "{\"engine_kwargs\": $dummy}" --out "$out/h200-compile-cache.json" 2>"$out/stderr-compile.log" ;;
  labels)
    python3 -m benchmarks.labels.label_decoding --model /tmp/llama-1b --engine-kwargs "$dummy" --rows "${ROWS:-10000}" \
        --rounds 2 --out "$out/h200-label-decoding.json" 2>"$out/stderr-decoding.log"
    python3 -m benchmarks.labels.confidence --model /tmp/llama-1b --engine-kwargs "$dummy" --rows "${ROWS:-10000}" \
        --rounds 2 --out "$out/h200-confidence-label.json" 2>"$out/stderr-confidence.log" ;;
  trace)
    python3 -m benchmarks.labels.label_step_trace --engine vllm --model /tmp/llama-1b --load-format dummy \
        --rows "${ROWS:-40000}" --input .bench/debian_packages.parquet --out "$out/h200-label-step.json" \
        ${TRACE_ARGS:-} 2>"$out/stderr-trace.log" ;;
  cascade)
    # The first stage with random weights of its own (normal, std 0.02): vLLM's dummy weights give
    # every answer about the same confidence, and no threshold splits such a model's rows.
    model 8b
    [ -s /tmp/llama-1b-rw/model.safetensors ] || python3 -m benchmarks.tools.make_dummy_model --shape 1b \
        --tokenizer .bench/tok --out /tmp/llama-1b-rw --random-weights 0.02
    python3 -m benchmarks.labels.cascade --first /tmp/llama-1b-rw --second /tmp/llama-8b --no-estimate --rows "${ROWS:-20000}" \
        --second-engine-kwargs "$dummy" --resource "{\"kv_cache_memory_gb\": 24, \"gpu_memory_utilization\": 0.3, \
\"max_num_seqs\": 512}" --out "$out/h200-cascade.json" 2>"$out/stderr-cascade.log" ;;
  *) echo "unknown step $step: compile, labels, trace or cascade" >&2; exit 2 ;;
esac
