"""Write a model folder of a given shape (config + the SmolLM2 tokenizer, no weights), for
vLLM's ``load_format="dummy"``: realistic throughput on a GPU without downloading weights.

    python -m benchmarks.tools.make_dummy_model --shape 1b \
        --tokenizer ~/.cache/sparkbatch/models/SmolLM2-135M-Instruct \
        --out .bench/llama-1b
    python -m benchmarks.tools.make_dummy_model --shape 1b --tokenizer .bench/tok --out /tmp/llama-1b-rw \
        --random-weights 0.02

The shapes are ``sparkbatch_dagster.testing.DUMMY_SHAPES`` (tiny, 1b, 8b, 70b).

``--random-weights STD`` also writes weights (``model.safetensors``, bf16, normal with that
standard deviation, seeded; made on the GPU when there is one): a model loaded the normal way,
whose answers are still meaningless but whose token probabilities differ from row to row.
vLLM's own dummy weights are uniform in +-0.001, which makes every answer's probability about
the same: a cascade's threshold (``cascade.py``) cannot split such a model's rows.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sparkbatch_dagster.testing import DUMMY_SHAPES, dummy_model


def write_weights(folder: Path, std: float, seed: int = 0) -> Path:
    """``model.safetensors`` for the folder's config: transformers' Llama, its weights drawn anew."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**json.loads((folder / "config.json").read_text()))
    config.initializer_range = std
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    gen = folder / "generation_config.json"
    kept = gen.read_bytes() if gen.exists() else None
    model.save_pretrained(folder, safe_serialization=True, max_shard_size="100GB")
    # save_pretrained writes transformers' generation config over SmolLM2's (which the runs apply).
    if kept is None:
        gen.unlink(missing_ok=True)
    else:
        gen.write_bytes(kept)
    return folder / "model.safetensors"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(DUMMY_SHAPES), required=True)
    ap.add_argument("--tokenizer", required=True, help="folder with the SmolLM2 tokenizer files")
    ap.add_argument("--out", required=True)
    ap.add_argument("--random-weights", type=float, metavar="STD", help="also write normal(0, STD) weights")
    args = ap.parse_args()
    folder = dummy_model(args.shape, args.out, args.tokenizer)
    if args.random_weights:
        write_weights(folder, args.random_weights)
    print(folder)


if __name__ == "__main__":
    main()
