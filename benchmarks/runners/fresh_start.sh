#!/usr/bin/env bash
# On the GPU device (../shared/gpu/README.md: staged first), the issue-61 measurements: `sparkbatch run`
# against a plain vLLM script, fresh processes (benchmarks/fresh_start.py), from a code snapshot carried
# in $SNAP (git archive of a commit: other people's half-made edits in the working tree stay out).
#
#   SNAP=.bench/e61/snap CODE=<sha> bash benchmarks/runners/fresh_start.sh labels "--rounds 3"          # warm
#   SNAP=.bench/e61/snap CODE=<sha> bash benchmarks/runners/fresh_start.sh labels "--rounds 3 --cold"
#   MODEL_SHAPE=8b SNAP=... bash benchmarks/runners/fresh_start.sh labels "--rounds 1 --label=-8b"
#
# with .gpu/common and .bench/e61 carried (.bench/e61/tok: the SmolLM2 tokenizer; .bench/e61/debian-40000.parquet).
# Results and every run's log land in $OUT. FIRST=1 also fills the caches with one untimed raw run.
set -euo pipefail
shape=${1:-labels}; extra=${2:-}
bash .gpu/common/device-install.sh >/dev/null
snap=$(cd "${SNAP:-.}" && pwd)
export PYTHONPATH=/tmp/site:$snap VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
# vLLM's own timings (weights, compile, CUDA graphs, KV cache) in each run's log, both sides alike.
export VLLM_LOGGING_LEVEL=INFO VLLM_LOGGING_STREAM=ext://sys.stderr
# The device sets PYTHONDONTWRITEBYTECODE: every process would compile vLLM's sources again, which
# a pip-installed venv never does. Written once here (both sides alike), as an install writes them.
unset PYTHONDONTWRITEBYTECODE
[ -e /tmp/pyc-warm ] || { python3 -c "import vllm.entrypoints.llm, dagster, sparkbatch_dagster.cli.commands" >/dev/null 2>&1; touch /tmp/pyc-warm; }
out=${OUT:-/tmp/out}; mkdir -p "$out"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h100|h200|a100|l40s|gb10' | tr A-Z a-z || echo gpu)
# MODEL_SHAPE: the dummy model's shape (sparkbatch_dagster.testing.DUMMY_SHAPES: 1b, 8b; give 8b a --label).
model=/tmp/llama-${MODEL_SHAPE:-1b}
[ -d "$model" ] || python3 "$snap/benchmarks/tools/make_dummy_model.py" --shape "${MODEL_SHAPE:-1b}" \
    --tokenizer .bench/e61/tok --out "$model" >/dev/null
# shellcheck disable=SC2086
python3 "$snap/benchmarks/fresh_start.py" --model "$model" --data .bench/e61/debian-40000.parquet \
    --shape "$shape" --card "$card" --code "${CODE:-unknown}" --out-dir "$out" $extra 2>&1 | tail -20
# One file back per invocation for the logs (a call brings back 8 files at most).
tar czf "$out/logs-$shape$(date +%H%M%S).tgz" -C "$out" logs && rm -rf "$out/logs"
