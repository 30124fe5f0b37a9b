"""Labels in one step against vLLM's choice grammar: speed and answers, one engine, same prompts.

    python -m benchmarks.labels.label_decoding --rows 600 --rounds 2 --out benchmarks/results/label-decoding-cpu.json
    python -m benchmarks.labels.label_decoding --model /models/llama-1b --engine-kwargs '{"load_format": "dummy"}'

One engine (``VLLMResource``, prefix caching off so every pass prefills in full) labels the same
Debian package descriptions with ``label_decoding="grammar"`` and ``"auto"`` (one decode step over
the tokens that begin exactly one label, ``engines/answers/label_tokens.py``), in A-B / B-A order per
round after one warm-up pass of each. The labels are the Debian sections among the 13 most common
whose first tokens tell them apart (SmolLM2's tokenizer), and the rows those sections' packages.
Reports each mode's median generation seconds, their ratio, how many answers the two modes share,
and each mode's accuracy against the archive's own section.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from benchmarks.lib.debian_labels import SECTIONS, engine_arguments, rows
from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import emit
from benchmarks.lib.switches import engine_switches


def main() -> None:
    args = engine_arguments(__doc__.splitlines()[0]).parse_args()
    from sparkbatch_dagster import OutputSpec, SamplingSpec, VLLMResource
    from sparkbatch_dagster.engines import EngineRequest
    from sparkbatch_dagster.engines.answers.label_tokens import plan

    data = rows(args.rows)
    output, sampling = OutputSpec(kind="label", labels=SECTIONS), SamplingSpec(max_tokens=8)
    system = "Sort Debian packages into their archive section. Answer with one of: " + ", ".join(SECTIONS)
    reqs = [EngineRequest(str(i), [{"role": "system", "content": system},
                                   {"role": "user", "content": f"Package: {r['package']}\n{r['description']}"}])
            for i, r in enumerate(data)]
    res = VLLMResource(model=args.model, enable_prefix_caching=False, engine_kwargs=json.loads(args.engine_kwargs))
    engine = res.get_engine()
    heads = plan(engine._tokenizer, sampling, output, "auto")
    assert heads, "these labels should be told apart by their first tokens"

    def run(mode: str) -> tuple[float, dict[str, str], int]:
        began = time.perf_counter()
        with engine_switches(engine, {"label_decoding": mode}):
            out = list(engine.generate(reqs, sampling, output))
        took = time.perf_counter() - began
        return took, {r.id: r.text for r in out}, sum(r.output_tokens for r in out)

    modes = ["grammar", "auto"]
    warm = {m: round(run(m)[0], 2) for m in modes}
    times: dict[str, list[float]] = {m: [] for m in modes}
    answers: dict[str, dict[str, str]] = {}
    tokens: dict[str, int] = {}
    for r in range(args.rounds):
        for m in modes if r % 2 == 0 else reversed(modes):
            took, answers[m], tokens[m] = run(m)
            times[m].append(round(took, 2))
            print(json.dumps({"round": r, "mode": m, "generate_s": times[m][-1]}), file=sys.stderr, flush=True)
    res.shutdown()
    gold = {str(i): r["section"] for i, r in enumerate(data)}
    same = sum(answers["auto"][k] == answers["grammar"][k] for k in gold)
    median = {m: statistics.median(times[m]) for m in modes}
    emit({
        "benchmark": "label_decoding", "machine": machine(),
        "model": args.model or "SmolLM2-135M-Instruct", "rows": len(data), "labels": SECTIONS,
        "allowed_tokens": len(heads.allowed), "settling_tokens": len(heads.labels),
        "rounds": args.rounds, "warmup_s": warm, "generate_s": times,
        "median_s": median, "grammar_over_one_step": round(median["grammar"] / median["auto"], 3),
        "output_tokens": tokens, "same_answers": same, "same_answers_share": round(same / len(gold), 4),
        "accuracy": {m: round(sum(answers[m][k] == g for k, g in gold.items()) / len(gold), 4) for m in modes},
    }, args.out)


if __name__ == "__main__":
    main()
