"""Write a model folder of a given shape (config + the SmolLM2 tokenizer, no weights), for
vLLM's ``load_format="dummy"``: realistic throughput on a GPU without downloading weights.

    python benchmarks/make_dummy_model.py --shape 1b --tokenizer ~/.cache/sparkbatch/models/SmolLM2-135M-Instruct \
        --out .bench/llama-1b
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

SHAPES = {
    # Llama-3.2-1B-like and Llama-3.1-8B-like bodies, with SmolLM2's 49k vocabulary.
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
           "num_key_value_heads": 8},
    "8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8},
}
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "generation_config.json"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--tokenizer", required=True, help="folder with the SmolLM2 tokenizer files")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    src, out = Path(args.tokenizer).expanduser(), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = json.loads((src / "config.json").read_text())
    config = {**base, **SHAPES[args.shape], "max_position_embeddings": 8192, "torch_dtype": "bfloat16",
              "tie_word_embeddings": args.shape == "1b", "head_dim": SHAPES[args.shape]["hidden_size"] // 32}
    config.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy(src / name, out / name)
    print(out)


if __name__ == "__main__":
    main()
