"""Server mode's client alone: how many requests a second this process can send and read back,
against an OpenAI-compatible server that answers at once (a stub in its own process).

    python -m benchmarks.server.server_client --out benchmarks/results/cpu-server-client.json

Server mode on an H200 ran at 0.79 of offline (``h200-1b-server.json``). This tells whether our
side of the socket is what caps it: the client's CPU time per request (the request body, the
HTTP round trip in the client's event-loop thread, the answer parsed), as ``VLLMServerEngine``
sends the H200 benchmark's own prompts, with chat bodies and with ``server_token_ids`` (the
chat template and tokenizer run here, ids go to ``/v1/completions``; the default for a server
started here), and ``server_token_ids`` with the bodies built inline on the caller's thread, as
before 2026-12-04 (``token_ids_inline``), instead of a chunk at a time on the encoding thread,
and ``server_token_ids`` with each request handed to the client's event loop alone
(``one_handoff_each``, ``asyncio.run_coroutine_threadsafe`` per request, as before 2026-12-04)
instead of a batch at a time (``engines/server/handoff.py``), and ``server_token_ids`` with Python's own
spacing of full garbage collections while the heap is frozen (``full_passes_unspaced``, as before
2026-12-04; ``engines/platform/heap.py``), and ``server_token_ids`` with ``PROMPTS_PER_REQUEST`` prompts per
request (``grouped``; ``engines/server/prompt_groups.py``, the default for a server started here; the
stub answers a choice per prompt), and ``grouped`` with the standard library's json on the wire
(``stdlib_json``, as before 2026-12-05) instead of msgspec's; ``--arms`` picks some. Each arm generates inside
``frozen_heap()``, as a run does, and records its full collections (``gen2_passes``, ``gen2_s``).
``--answer-delay 2`` keeps each request at the stub that long, so thousands are in flight at once
as on the H200 server.
Arms alternate A-B-C / C-B-A. ``caller_ms_per_request`` is the CPU time of the thread that calls
``generate``: in a run, the labeling step's thread, which also writes every answer.
``client_max_requests_per_s`` (1 / CPU seconds per request) is what
one core of this machine could sustain; set it against the rate the H200 server delivered.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple
from unittest import mock

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import emit
from sparkbatch_dagster.engines.server.prompt_groups import PROMPTS_PER_REQUEST

ROOT = Path(__file__).resolve().parents[2]


STUB = """
import asyncio
import sys
from aiohttp import web

root, port, delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])

async def models(request):
    return web.json_response({"object": "list", "data": [{"id": "m", "root": root, "max_model_len": 4096}]})

async def answer(request):
    body = await request.json()  # read and parse it, as a server must; canned answers: their cost is not measured
    await asyncio.sleep(delay)
    prompt = body.get("prompt")
    prompts = prompt if prompt and isinstance(prompt[0], list) else [prompt]  # several prompts: a choice each
    choices = [{"index": i, "message": {"content": "ok"}, "text": "ok"} for i in range(len(prompts))]
    if body.get("return_token_ids"):  # as vLLM: the prompt's ids come back with the answer's
        for choice, ids in zip(choices, prompts):
            choice.update(prompt_token_ids=ids, token_ids=[1] * 64)
    return web.json_response({"model": "m", "choices": choices,
                              "usage": {"prompt_tokens": 1000 * len(prompts), "completion_tokens": 64 * len(prompts)}})

app = web.Application(client_max_size=64 << 20)
app.add_routes([web.get("/v1/models", models), web.post("/v1/chat/completions", answer),
                web.post("/v1/completions", answer)])
web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)
"""


def _wait(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("the stub server exited")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("the stub server did not start")


class Arm(NamedTuple):
    """An arm's client settings; the defaults are the client as it is now (one prompt per request)."""

    token_ids: bool = True  # server_token_ids
    ahead: bool = True  # bodies built on the encoding thread
    batched: bool = True  # requests handed to the loop in batches
    spaced: bool = True  # full collections spaced out while the heap is frozen
    per_request: int = 1  # prompts per request
    fast_json: bool = True  # msgspec's JSON on the wire


ARMS = {"chat": Arm(token_ids=False), "token_ids": Arm(), "token_ids_inline": Arm(ahead=False),
        "one_handoff_each": Arm(batched=False), "full_passes_unspaced": Arm(spaced=False),
        "grouped": Arm(per_request=PROMPTS_PER_REQUEST),
        "stdlib_json": Arm(per_request=PROMPTS_PER_REQUEST, fast_json=False)}

#: The wire as it was before 2026-12-05: the standard library's json (aiohttp's ``json=`` and
#: ``response.json()``), for the ``stdlib_json`` arm.
STDLIB_WIRE = {"_dumps": lambda body: json.dumps(body).encode(), "_loads": json.loads,
               "_key": lambda settings: json.dumps(settings, sort_keys=True)}


def _arm(url: str, arm: str, requests: list[Any], sampling: Any, output: Any, in_flight: int) -> dict:
    from benchmarks.lib.switches import inline_encoding, unbatched_handoff
    from sparkbatch_dagster.engines.config import EngineSettings
    from sparkbatch_dagster.engines.platform import heap
    from sparkbatch_dagster.engines.server import prompt_groups
    from sparkbatch_dagster.engines.server.vllm_server import VLLMServerEngine

    token_ids, ahead, batched, spaced, per_request, fast_json = ARMS[arm]
    cfg = EngineSettings(engine="server", model="m", endpoints=(url,), max_in_flight=in_flight,
                         server_token_ids=token_ids, server_prompts_per_request=per_request)
    engine = VLLMServerEngine(cfg, url, "m")
    passes: list[float] = []
    started: list[float] = []

    def full_pass(phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            started.append(time.perf_counter())
        else:
            passes.append(time.perf_counter() - started[-1])

    gc.collect()  # each arm starts from the same collector state
    gc.callbacks.append(full_pass)
    spacing, heap.FULL_PASS_SPACING = heap.FULL_PASS_SPACING, heap.FULL_PASS_SPACING if spaced else 1
    try:
        wall, cpu, caller = time.perf_counter(), time.process_time(), time.thread_time()
        with heap.frozen_heap(), contextlib.nullcontext() if fast_json else \
                mock.patch.multiple(prompt_groups, **STDLIB_WIRE), \
                contextlib.nullcontext() if ahead else inline_encoding(), \
                contextlib.nullcontext() if batched else unbatched_handoff():
            answered = sum(1 for r in engine.generate(requests, sampling, output) if r.error is None)
        wall, cpu, caller = time.perf_counter() - wall, time.process_time() - cpu, time.thread_time() - caller
    finally:
        heap.FULL_PASS_SPACING = spacing
        gc.callbacks.remove(full_pass)
        engine.close()
    if answered != len(requests):
        raise SystemExit(f"{len(requests) - answered} requests failed")
    return {"wall_s": wall, "cpu_s": cpu, "caller_cpu_s": caller, "gen2_passes": len(passes), "gen2_s": sum(passes),
            "http_requests": engine.groups.requests}


def main() -> None:
    from benchmarks.lib.workload import build_spec, conversations, synthetic_rows
    from sparkbatch_dagster.engines.base import EngineRequest
    from sparkbatch_dagster.engines.platform.model import DEFAULT_MODEL_NAME, ensure_embedded
    from sparkbatch_dagster.engines.server.server_process import free_port

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rows", type=int, default=8000, help="requests per arm (the H200 server run's 8,000)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-in-flight", type=int, default=1024)
    p.add_argument("--h200", default=str(ROOT / "benchmarks" / "results" / "h200-1b-server.json"))
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    p.add_argument("--answer-delay", type=float, default=0.0, help="seconds the stub holds each request")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    arms = args.arms.split(",")
    if not arms or any(a not in ARMS for a in arms):
        raise SystemExit(f"--arms {args.arms!r}: name some of {', '.join(ARMS)}")
    home = Path(tempfile.mkdtemp(prefix="sparkbatch-client-"))
    spec = build_spec(argparse.Namespace(mode="synthetic", rows=args.rows, max_tokens=64, shards=8), home)
    rows = synthetic_rows(args.rows)
    requests = [EngineRequest(r["id"], m) for r, m in zip(rows, conversations(spec, rows), strict=True)]
    tokenizer_root = str(ensure_embedded(DEFAULT_MODEL_NAME))  # the H200 runs' dummy models carry this tokenizer
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", STUB, tokenizer_root, str(port), str(args.answer_delay)])
    times: dict[str, list[dict]] = {arm: [] for arm in arms}
    try:
        _wait(port, proc)
        url = f"http://127.0.0.1:{port}"
        for arm in arms:  # warm-up: the tokenizer's first calls, the stub's first connections
            _arm(url, arm, requests[:256], spec.sampling, spec.output, args.max_in_flight)
        for n in range(args.rounds):
            for arm in arms if n % 2 == 0 else arms[::-1]:
                times[arm].append(_arm(url, arm, requests, spec.sampling, spec.output, args.max_in_flight))
                got = times[arm][-1]
                print(f"round {n} {arm}: {got['wall_s']:.2f} s, client CPU {got['cpu_s']:.2f} s, "
                      f"caller's thread {got['caller_cpu_s']:.2f} s, {got['gen2_passes']} full collections "
                      f"{got['gen2_s']:.2f} s", file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait(10)
    result: dict[str, Any] = {"benchmark": "server_client", "rows": args.rows, "rounds": args.rounds,
                              "max_in_flight": args.max_in_flight, "answer_delay_s": args.answer_delay,
                              "prompt": "throughput.py synthetic",
                              "machine": machine(cpu_only=True)}
    for arm, runs in times.items():
        cpu_ms = statistics.median(r["cpu_s"] for r in runs) / args.rows * 1000
        result[arm] = {"wall_s": [round(r["wall_s"], 2) for r in runs], "cpu_s": [round(r["cpu_s"], 2) for r in runs],
                       "caller_cpu_s": [round(r["caller_cpu_s"], 2) for r in runs],
                       "gen2_passes": [r["gen2_passes"] for r in runs], "gen2_s": [round(r["gen2_s"], 3) for r in runs],
                       "http_requests": [r["http_requests"] for r in runs],
                       "requests_per_s": round(args.rows / statistics.median(r["wall_s"] for r in runs)),
                       "client_ms_per_request": round(cpu_ms, 3), "client_max_requests_per_s": round(1000 / cpu_ms),
                       "caller_ms_per_request": round(statistics.median(r["caller_cpu_s"] for r in runs)
                                                      / args.rows * 1000, 3)}
    if "token_ids" in times and "one_handoff_each" in times:  # the same arm, one hand-off per request
        result["batched_over_each_cpu"] = round(result["token_ids"]["client_ms_per_request"]
                                                / result["one_handoff_each"]["client_ms_per_request"], 3)
    if "grouped" in times and "token_ids" in times:  # the same arm, one prompt per request
        result["grouped_over_one_each_cpu"] = round(result["grouped"]["client_ms_per_request"]
                                                    / result["token_ids"]["client_ms_per_request"], 3)
    if "grouped" in times and "stdlib_json" in times:  # the same arm, the standard library's json on the wire
        result["msgspec_over_stdlib_json_cpu"] = round(result["grouped"]["client_ms_per_request"]
                                                       / result["stdlib_json"]["client_ms_per_request"], 3)
    if "token_ids" in times and "full_passes_unspaced" in times:  # the same arm, Python's own full-pass spacing
        result["spaced_over_unspaced_cpu"] = round(result["token_ids"]["client_ms_per_request"]
                                                   / result["full_passes_unspaced"]["client_ms_per_request"], 3)
    h200 = Path(args.h200)
    if h200.exists():  # the rate the H200's vllm serve delivered, for scale
        ref = json.loads(h200.read_text())
        served = ref["rows"] / statistics.median(ref["server_pipeline_s"])
        result["h200_server_requests_per_s"] = round(served)
        result["headroom"] = {arm: round(result[arm]["client_max_requests_per_s"] / served, 1) for arm in times}
    emit(result, args.out)


if __name__ == "__main__":
    main()
