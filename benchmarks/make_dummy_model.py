"""Write a model folder of a given shape (config + the SmolLM2 tokenizer, no weights), for
vLLM's ``load_format="dummy"``: realistic throughput on a GPU without downloading weights.

    python benchmarks/make_dummy_model.py --shape 1b --tokenizer ~/.cache/sparkbatch/models/SmolLM2-135M-Instruct \
        --out .bench/llama-1b

The shapes are ``sparkbatch_dagster.testing.DUMMY_SHAPES`` (tiny, 1b, 8b, 70b).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkbatch_dagster.testing import DUMMY_SHAPES, dummy_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(DUMMY_SHAPES), required=True)
    ap.add_argument("--tokenizer", required=True, help="folder with the SmolLM2 tokenizer files")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    print(dummy_model(args.shape, args.out, args.tokenizer))


if __name__ == "__main__":
    main()
