"""Check the estimate's roofline model against H200 measurements: project each measured job from
the h200 preset's hardware figures alone and compare with what one H200 took.

    python -m benchmarks.engine.roofline_check --out benchmarks/results/roofline-h200.json

Inputs: the throughput result files of one H200 (``h200-1b-*.json``, ``h200-8b-*.json``: rows,
``max_tokens``, ``raw_tokens`` = prompt + output tokens, seconds per round), shapes from
``sparkbatch_dagster.testing.DUMMY_SHAPES`` with SmolLM2's 49,152-token vocabulary (what
``benchmarks/tools/make_dummy_model.py`` wrote). Output tokens are ``rows x max_tokens`` (synthetic jobs
set ``ignore_eos``; a Debian label may stop before its 8 tokens, so there it is an upper bound),
batch ``max_num_seqs`` = 1024 (the GPU default those runs used), no prefix-cache share (the
model's default when it is not known). Measured time = tokens / ``raw_tokens_per_s`` (plain
``LLM.chat``) and tokens / ``pipeline_tokens_per_s`` (the sparkbatch run) both; no GPU is needed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.lib.results_io import emit
from sparkbatch_dagster.engines.platform.model import param_count
from sparkbatch_dagster.estimate.roofline import EFFICIENCY, ModelShape, Workload, project
from sparkbatch_dagster.spec import PRESETS
from sparkbatch_dagster.testing import DUMMY_SHAPES

ROOT = Path(__file__).resolve().parents[2]


RESULTS = ROOT / "benchmarks" / "results"
FILES = ["h200-1b-synthetic.json", "h200-1b-synthetic-8000.json", "h200-1b-synthetic-16000-2.json",
         "h200-8b-synthetic.json", "h200-1b-debian.json"]
VOCAB = 49_152  # SmolLM2's tokenizer, which make_dummy_model.py puts in every shape
MAX_NUM_SEQS = 1024


def shape_of(name: str) -> ModelShape:
    """A dummy shape ('llama-1b' -> '1b') as the roofline sees it: bf16 weights and KV cache."""
    body = DUMMY_SHAPES[name.removeprefix("llama-")]
    cfg = {**body, "vocab_size": VOCAB, "tie_word_embeddings": name.endswith(("tiny", "1b"))}
    params = param_count(cfg)
    assert params is not None
    head_dim = body["hidden_size"] // body["num_attention_heads"]
    return ModelShape(float(params), 2.0, 2 * body["num_hidden_layers"] * body["num_key_value_heads"] * head_dim * 2)


def check(name: str, d: dict[str, Any]) -> dict[str, Any]:
    """One measured job against its projection (errors: projection over measurement, in %)."""
    output = d["rows"] * d["max_tokens"]
    work = Workload(d["rows"], d["raw_tokens"] - output, output, MAX_NUM_SEQS)
    shape = shape_of(d["shape"])
    proj = project(work, shape, PRESETS["h200"])
    tokens = d["raw_tokens"]
    measured = {"raw": tokens / d["raw_tokens_per_s"], "pipeline": tokens / d["pipeline_tokens_per_s"]}
    peak = proj.prefill_s + proj.decode_s
    out: dict[str, Any] = {
        "file": name, "shape": d["shape"], "mode": d["mode"], "rows": d["rows"], "max_tokens": d["max_tokens"],
        "prompt_tokens": work.prompt_tokens, "output_tokens": output, "params": shape.params,
        "projection": proj.rounded().to_json(), "projected_low_s": round(proj.low_s, 2),
        "projected_high_s": round(proj.high_s, 2),
    }
    for arm, secs in measured.items():
        out[f"measured_{arm}_s"] = round(secs, 2)
        out[f"{arm}_inside_range"] = proj.low_s <= secs <= proj.high_s
        # How far each end of the range is from the measurement, and the efficiency it implies.
        out[f"{arm}_error_low_pct"] = round((proj.low_s / secs - 1) * 100, 1)
        out[f"{arm}_error_high_pct"] = round((proj.high_s / secs - 1) * 100, 1)
        out[f"{arm}_efficiency"] = round(peak / secs, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--out", help="result file to write (benchmarks/results/roofline-h200.json)")
    args = ap.parse_args()
    jobs = [check(n, json.loads((RESULTS / n).read_text())) for n in FILES if (RESULTS / n).exists()]
    inside = sum(j["raw_inside_range"] for j in jobs) + sum(j["pipeline_inside_range"] for j in jobs)
    emit({"benchmark": "roofline", "machine": "NVIDIA H200 x1", "hardware": PRESETS["h200"].model_dump(),
          "efficiency": list(EFFICIENCY), "max_num_seqs": MAX_NUM_SEQS, "cached_share": 0.0,
          "command": "python -m benchmarks.engine.roofline_check --out benchmarks/results/roofline-h200.json",
          "inside_range": f"{inside} of {2 * len(jobs)}", "jobs": jobs}, args.out)


if __name__ == "__main__":
    main()
