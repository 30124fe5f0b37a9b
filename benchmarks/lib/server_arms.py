"""throughput.py's server arms: `vllm serve` beside the offline engine (``--alongside``), or
started once per group of variants after it (``--server``, ``--server-variants``), each round a
pipeline through it, its prefix cache reset first, as the offline arms reset theirs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from sparkbatch_dagster import VLLMResource
from sparkbatch_dagster.engines.server.prompt_groups import token_ids


def start_alongside(args: argparse.Namespace, kw: dict[str, Any], res: dict[str, Any], pipeline: Any,
                    times: dict[str, list[float]], totals: dict[str, Any], arm: str = "server",
                    settings: dict[str, Any] | None = None) -> Any:
    """--alongside: `vllm serve` started (timed) beside the offline engine, with the same settings
    and ``settings`` (VLLMResource fields) on top, and one untimed warm-up round through
    it; returns the arm (a round: the pipeline through the server, its prefix cache reset
    first; its seconds in ``times[arm]``, the runner's own in ``times[arm + "_labeling"]``), or
    None without --alongside."""
    if not args.alongside:
        return None
    if not args.server:
        raise SystemExit("--alongside KV_GB compares server mode with offline: give --server too")
    os.environ.setdefault("VLLM_SERVER_DEV_MODE", "1")  # /reset_prefix_cache, as the offline arms reset theirs
    started = time.perf_counter()
    server = VLLMResource(**with_variant({**kw, "engine": "server"}, settings or {}))
    url = server.get_engine().base_url  # type: ignore[attr-defined]
    totals[f"{arm}_start_s"] = time.perf_counter() - started
    offline = res["vllm"]

    def server_round(n: int, tag: str = arm) -> float:
        res["vllm"] = server
        reset_prefix_cache(url)
        try:
            return pipeline(n, f"-{tag}")
        finally:
            res["vllm"] = offline
            times.setdefault(f"{arm}_labeling", []).append(times["labeling"].pop())  # not the offline arm's

    server_round.url = url  # type: ignore[attr-defined]  # --sample reads its /metrics
    server_round.pid = server.get_engine().server.proc.pid  # type: ignore[attr-defined]  # --profile
    server_round(0, f"{arm}-warmup")  # its first requests pay the server's own warm-up, as in run_server_variants
    times[f"{arm}_labeling"].clear()
    times[arm] = []  # the rounds' loop appends each timed round
    return server_round


def json_object(text: str) -> dict[str, Any]:
    """An option's JSON object of VLLMResource fields (argparse ``type``: a bad one is a usage error)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("a JSON object of {VLLMResource field: value}")
    return value


#: VLLMResource fields that change only the client: variants that differ in these alone share a server.
CLIENT_ONLY = ("server_token_ids", "max_in_flight", "request_timeout_s", "max_retries")


def server_variants(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """--server-variants as {name: VLLMResource overrides}; --server is one variant, the defaults."""
    if args.server_variants:
        variants = json.loads(args.server_variants)
        if not isinstance(variants, dict) or not variants or not all(isinstance(v, dict) for v in variants.values()):
            raise SystemExit("--server-variants: a JSON object of {name: {VLLMResource field: value}}")
        return variants
    return {"server": {}} if args.server else {}


def with_variant(kw: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's resource fields with a variant's on top; ``engine_kwargs`` merged, so a
    variant's ``api_server_count`` keeps the run's ``load_format`` (dummy weights)."""
    engine_kwargs = {**kw.get("engine_kwargs", {}), **over.get("engine_kwargs", {})}
    return {**kw, **over, **({"engine_kwargs": engine_kwargs} if engine_kwargs else {})}


def run_server_variants(variants: dict[str, dict[str, Any]], kw: dict[str, Any], repeat: int,
                        server_round: Any, times: dict[str, list[float]], totals: dict[str, Any],
                        current: dict[str, Any]) -> None:
    """Each server once (started timed), its variants' pipeline rounds A-B / B-A against it.

    Each client runs one untimed warm-up round first. The server's prefix cache is reset before
    each round (``/reset_prefix_cache``, served with ``VLLM_SERVER_DEV_MODE``), as the offline
    arms reset theirs; ``times["server"]`` is the first variant's rounds, ``times["server:NAME"]``
    each variant's. ``current["e"]`` is the engine of the round running (the pipeline resets an
    offline engine's prefix cache there)."""
    os.environ.setdefault("VLLM_SERVER_DEV_MODE", "1")  # inherited by each `vllm serve` started here
    groups: dict[str, list[str]] = {}
    for name, over in variants.items():
        server_side = {k: v for k, v in over.items() if k not in CLIENT_ONLY}
        groups.setdefault(json.dumps(server_side, sort_keys=True), []).append(name)
    totals["server_variants"] = {}
    for names in groups.values():
        started = time.perf_counter()
        owner = VLLMResource(engine="server", **with_variant(kw, variants[names[0]]))
        engine = current["e"] = owner.get_engine()
        start_s = time.perf_counter() - started
        url = engine.base_url  # type: ignore[attr-defined]
        # Through server_url a client would take the default for someone else's server (chat
        # bodies); this server was started here, so its clients get the started server's default.
        served = {**kw, "model": engine.served_name,  # type: ignore[attr-defined]
                  "server_token_ids": token_ids(owner.engine_settings(), started_here=True)}
        clients = {names[0]: owner} | {name: VLLMResource(engine="server", server_url=url, **{
            **served, **{k: v for k, v in variants[name].items() if k in CLIENT_ONLY}}) for name in names[1:]}
        try:
            # One untimed round per client first, as the offline pipeline's rounds follow the raw
            # arm's on a warm engine: a server's first requests pay its own warm-up (grammar
            # compiles, the API server's first batches), which the first timed round would carry.
            for name in names:
                reset_prefix_cache(url)
                server_round(clients[name], 0, f"{name}-warmup")
            for n in range(repeat):
                for name in names if n % 2 == 0 else names[::-1]:
                    reset_prefix_cache(url)
                    times.setdefault(f"server:{name}", []).append(server_round(clients[name], n, name))
        finally:
            for client in clients.values():
                client.shutdown()
        for name in names:
            totals["server_variants"][name] = {"settings": variants[name], "server_start_s": start_s}
    first = next(iter(variants))
    times["server"] = times[f"server:{first}"]
    totals["server_start_s"] = totals["server_variants"][first]["server_start_s"]


def reset_prefix_cache(url: str) -> None:
    """The server's prefix cache emptied (served with ``VLLM_SERVER_DEV_MODE``), as the offline
    arms reset theirs before each round."""
    import urllib.request

    try:
        urllib.request.urlopen(urllib.request.Request(f"{url}/reset_prefix_cache", method="POST"), timeout=60).close()
    except OSError as exc:
        print(f"warning: {url}/reset_prefix_cache: {exc}", file=sys.stderr)
