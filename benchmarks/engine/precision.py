"""bf16 against another precision through the pipeline, from two ``throughput.py`` result files
of the same job on the same machine (one engine per process: a GPU holds one at 90% memory).

    python3 -m benchmarks.engine.precision A.json B.json --out benchmarks/results/h200-8b-fp8.json

Prints one JSON object: each file's rates and B/A for the pipeline, the labeling step and raw
``LLM.chat``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.lib.results_io import emit

SAME = ("mode", "shape", "rows", "max_tokens", "machine", "vllm")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("a", help="baseline result file (bf16)")
    p.add_argument("b", help="the other precision's result file")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    a, b = (json.loads(Path(f).read_text()) for f in (args.a, args.b))
    differ = [k for k in SAME if a.get(k) != b.get(k)]
    if differ:
        raise SystemExit(f"the two runs are not the same job: {differ} differ")

    def rates(r: dict) -> dict:
        tokens = r["raw_tokens"] * r["rounds"]
        return {"engine_kwargs": r.get("engine_kwargs", {}), "engine_start_s": r["engine_start_s"],
                "raw_tokens_per_s": r["raw_tokens_per_s"], "pipeline_tokens_per_s": r["pipeline_tokens_per_s"],
                "labeling_tokens_per_s": round(tokens / sum(r["labeling_s"]), 1), "pipeline_s": r["pipeline_s"],
                "errors": r["errors"]}

    ra, rb = rates(a), rates(b)
    emit({"benchmark": "precision", **{k: a.get(k) for k in SAME}, "rounds": a["rounds"], "a": ra, "b": rb,
          "pipeline_ratio": round(rb["pipeline_tokens_per_s"] / ra["pipeline_tokens_per_s"], 4),
          "labeling_ratio": round(rb["labeling_tokens_per_s"] / ra["labeling_tokens_per_s"], 4),
          "raw_ratio": round(rb["raw_tokens_per_s"] / ra["raw_tokens_per_s"], 4)}, args.out)


if __name__ == "__main__":
    main()
