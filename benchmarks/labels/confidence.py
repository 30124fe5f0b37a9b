"""What a confidence on every row costs: one engine, the same prompts, with and without it.

    python -m benchmarks.labels.confidence --rows 600 --rounds 2 --out benchmarks/results/confidence-cpu-label.json
    python -m benchmarks.labels.confidence --kind json --rows 200 --out benchmarks/results/confidence-cpu-json.json
    python -m benchmarks.labels.confidence --model /models/llama-1b --engine-kwargs '{"load_format": "dummy"}'

One engine (``VLLMResource``, prefix caching off so every pass prefills in full) answers the same
Debian package descriptions with the engine's ``confidence`` on (log-probabilities asked per
token, ``engines/answers/confidence.py``) and off, in A-B / B-A order per round after one warm-up pass of
each. ``--kind label``: the Debian sections of ``lib/debian_labels.py`` (one-step decoding, the
default); ``--kind json``: ``{"section": ..., "summary": ...}``. Reports each mode's median
generation seconds and their ratio, whether the answers are the same, and, for labels, how
reliable the confidence is on these rows: accuracy against the archive's own section per
confidence bucket.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

from benchmarks.lib.debian_labels import SECTIONS, engine_arguments, rows
from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import emit
from benchmarks.lib.switches import no_confidence

ROOT = Path(__file__).resolve().parents[2]

SCHEMA = {"type": "object", "properties": {"section": {"type": "string", "enum": SECTIONS},
                                           "summary": {"type": "string", "maxLength": 60}},
          "required": ["section", "summary"]}


def reliability(pairs: list[tuple[float, bool]]) -> list[dict[str, float]]:
    """Accuracy per confidence bucket of tenths (the non-empty ones)."""
    out = []
    for b in range(10):
        got = [ok for c, ok in pairs if min(int(c * 10), 9) == b]
        if got:
            out.append({"bucket": f"{b / 10:.1f}-{(b + 1) / 10:.1f}", "rows": len(got),
                        "accuracy": round(sum(got) / len(got), 4)})
    return out


def main() -> None:
    ap = engine_arguments(__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=["label", "json"], default="label")
    args = ap.parse_args()
    from sparkbatch_dagster import OutputSpec, SamplingSpec, VLLMResource
    from sparkbatch_dagster.engines import EngineRequest

    data = rows(args.rows)
    if args.kind == "label":
        output, sampling = OutputSpec(kind="label", labels=SECTIONS), SamplingSpec(max_tokens=8)
        ask = "Answer with one of: " + ", ".join(SECTIONS)
    else:
        output, sampling = OutputSpec(kind="json", json_schema=SCHEMA), SamplingSpec(max_tokens=64)
        ask = "Answer in JSON: its section (one of " + ", ".join(SECTIONS) + ") and a short summary."
    system = "Sort Debian packages into their archive section. " + ask
    reqs = [EngineRequest(str(i), [{"role": "system", "content": system},
                                   {"role": "user", "content": f"Package: {r['package']}\n{r['description']}"}])
            for i, r in enumerate(data)]
    res = VLLMResource(model=args.model, enable_prefix_caching=False, engine_kwargs=json.loads(args.engine_kwargs))
    engine = res.get_engine()

    def run(mode: str) -> tuple[float, dict[str, object]]:
        began = time.perf_counter()
        with no_confidence() if mode == "off" else contextlib.nullcontext():
            out = list(engine.generate(reqs, sampling, output))
        return time.perf_counter() - began, {r.id: r for r in out}

    modes = ["off", "on"]
    warm = {m: round(run(m)[0], 2) for m in modes}
    times: dict[str, list[float]] = {m: [] for m in modes}
    answers: dict[str, dict] = {}
    for r in range(args.rounds):
        for m in modes if r % 2 == 0 else reversed(modes):
            took, answers[m] = run(m)
            times[m].append(round(took, 2))
            print(json.dumps({"round": r, "mode": m, "generate_s": times[m][-1]}), file=sys.stderr, flush=True)
    res.shutdown()
    median = {m: statistics.median(times[m]) for m in modes}
    on = answers["on"]
    same = sum(on[k].text == answers["off"][k].text for k in on)
    sure = [r.confidence for r in on.values() if r.confidence is not None]
    result = {
        "benchmark": "confidence", "machine": machine(), "kind": args.kind,
        "model": args.model or "SmolLM2-135M-Instruct", "rows": len(data), "rounds": args.rounds,
        "warmup_s": warm, "generate_s": times, "median_s": median,
        "on_over_off": round(median["on"] / median["off"], 3),
        "same_answers": same, "rows_with_confidence": len(sure),
        "mean_confidence": round(statistics.mean(sure), 4) if sure else None,
    }
    if args.kind == "label":
        gold = {str(i): r["section"] for i, r in enumerate(data)}
        pairs = [(r.confidence, r.text == gold[k]) for k, r in on.items() if r.confidence is not None]
        result["accuracy"] = round(sum(ok for _, ok in pairs) / max(len(pairs), 1), 4)
        result["reliability"] = reliability(pairs)
    emit(result, args.out)


if __name__ == "__main__":
    main()
