#!/usr/bin/env bash
# On the H200 device (see ../shared/gpu/README.md): after the staging calls, run
#   REPEAT=4 bash benchmarks/runners/h200.sh 1b 16000 64      # shape, rows, output tokens (4 A-B/B-A rounds)
#   REPEAT=2 bash benchmarks/runners/h200.sh 1b 8000 64 synthetic --server   # more arguments go to throughput.py
#   REPEAT=2 bash benchmarks/runners/h200.sh 1b 8000 64 synthetic --no-generate --server-variants \
#       '{"ids": {}, "chat": {"server_token_ids": false}, "api4": {"engine_kwargs": {"api_server_count": 4}}}'
#   REPEAT=4 bash benchmarks/runners/h200.sh 1b 6000 64 synthetic --no-generate --server --alongside 40 --thawed server \
#       --profile /tmp/prof    # the server arm A-B, heap frozen or not; garbage collections per arm (py-spy too if on PATH)
#   REPEAT=2 bash benchmarks/runners/h200.sh 1b 6000 64 synthetic --no-generate --server --alongside 30 --sample \
#       --server-b '{"engine_kwargs": {"api_server_count": 1}}'   # two servers beside offline, interleaved
#   BENCH=data_parallel REPEAT=2 bash benchmarks/runners/h200.sh 1b 16000 64 synthetic --gpus 2   # 1 GPU vs 2 (2-GPU host)
#   BENCH=tensor_parallel bash benchmarks/runners/h200.sh 70b 2000 64 synthetic --tp 2 [--nnodes 2]  # 70B over 2 GPUs
# with .gpu/common and .bench carried (the SmolLM2 tokenizer in .bench/tok, the Debian set in
# .bench/debian_packages.parquet): create .bench once on your own machine with
#   bash benchmarks/runners/make_bench_dir.sh
# (this script runs it first: on the GPU machine it only checks that .bench is whole, and names
# what is missing). The result file is $OUT/result-<shape>-<mode>.json. The estimate
# (matplotlib for its chart) needs the bundle built with
#   EXTRA="matplotlib==3.11.2 contourpy==1.3.3 cycler==0.12.1 fonttools==4.68.0 kiwisolver==1.5.1
#          pyparsing==3.3.3 pillow==13.0.0" ../shared/gpu/pack       # 4 chunks: 4 staging calls
set -euo pipefail
shape=${1:-1b}; rows=${2:-20000}; max_tokens=${3:-64}; mode=${4:-synthetic}
bash benchmarks/runners/make_bench_dir.sh
bash .gpu/common/device-install.sh
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}; mkdir -p "$out"
python3 -m benchmarks.tools.make_dummy_model --shape "$shape" --tokenizer .bench/tok --out "/tmp/llama-$shape"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/gpu.txt"
tag=$shape-$mode${BENCH:+-$BENCH}   # BENCH: another script here with the same options (data_parallel)
# BENCH names a script by its file name, at the top or in an area folder (gpu/data_parallel.py).
script=$(compgen -G "benchmarks/${BENCH:-throughput}.py" || compgen -G "benchmarks/*/${BENCH:-throughput}.py" || true)
[ -n "$script" ] || { echo "BENCH=$BENCH: no benchmarks/**/$BENCH.py" >&2; exit 2; }
script=${script%.py}
python3 -m "${script//\//.}" --mode "$mode" --model "/tmp/llama-$shape" --load-format dummy --gpu \
    --rows "$rows" --max-tokens "$max_tokens" --shards 8 --repeat "${REPEAT:-2}" --data .bench/debian_packages.parquet \
    --out "$out/result-$tag.json" "${@:5}" 2>"$out/stderr-$tag.log" | tail -1
