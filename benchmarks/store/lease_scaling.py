"""Leases at scale: one box holds thousands of shard claims while the store answers slowly, and
its renewal traffic stays one conditional PUT a third of a lease, whatever the shards it holds.

    export PYTHONPATH=.:tests/support   # the tests' shared code these use (benchmarks/lib/support.py)
    python -m benchmarks.store.lease_scaling --out benchmarks/results/lease-scaling-$(date -u +%F).json
    python -m benchmarks.store.lease_scaling --shards 200 --lease-seconds 6     # a quick look

Against moto's S3 server on loopback, each box through its own fault proxy (tests/support/faults.py)
that holds every request ``--latency-ms`` before forwarding it (so each proxy's log is exactly
one box's requests):

1. Box A takes claims on ``--shards`` shards through ``Claims.take`` (the run's own path), timed.
2. A holds them for at least ``--hold-leases`` lease lengths while the keeper renews its box
   lease; meanwhile box B (another home, another cache, its own box lease) sweeps every shard
   again and again (``--min-rounds`` at least) with ``lease_wait=False`` from ``--b-threads``
   threads (``--b-sample N``: N random shards a round instead). Every shard B gets is a live
   shard taken over: must be 0.
3. The renewal requests A made in that window (its log, on ``leases/boxes/``), per minute,
   against the previous design's: a HEAD and a PUT per shard every third of a lease.
4. A releases everything (``Claims.release_all``, timed): A's objects left under ``leases/``.
5. Pause: A takes ``--pause-shards`` shards again, its keeper stops renewing (``KEEPER.remove``)
   until its box lease is past its expiry; B's ``Claims.take`` must then get all of them (fence,
   then claims), and A's ``renew()`` must answer False with every claim lost. Then both release:
   nothing is left under ``leases/``.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import emit
from benchmarks.lib.support import support

ROOT = Path(__file__).resolve().parents[2]

VERSION = "1ea5e5ca1e000000"  # any output fingerprint: no shard is ever labeled here


class Said(logging.Handler):
    """Counts what the leases say (takeovers, lost boxes, failed renewals) without printing it all."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def count(self, text: str) -> int:
        return sum(text in line for line in self.lines)


def requests(log: list[tuple[str, str, str]], contains: str) -> dict[str, int]:
    """Requests in a proxy log whose path holds ``contains``, by method."""
    out: dict[str, int] = {}
    for method, path, _ in log:
        if contains in path:
            out[method] = out.get(method, 0) + 1
    return out


def sweep(home: Any, keys: list[str], threads: int) -> tuple[int, int]:
    """Box B tries every key once without waiting for a live lease: (attempts, shards it got)."""
    def one(key: str) -> int:
        lock = home.partition_lock(VERSION, key)
        if not lock.acquire(wait=False, lease_wait=False):
            return 0
        return 1  # a live shard taken over: kept, so that box A would see it lost

    with ThreadPoolExecutor(threads) as pool:
        return len(keys), sum(pool.map(one, keys))


def left_under_leases(server: Any, bucket: str) -> list[str]:
    """Every object under the job's ``leases/``, read straight from moto (no proxy, no cache)."""
    fs = server.fs()
    try:
        return sorted(fs.find(f"{bucket}/job/leases"))
    except FileNotFoundError:
        return []


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--shards", type=int, default=2000)
    p.add_argument("--latency-ms", type=float, default=100.0, help="added to every request by the proxies")
    p.add_argument("--lease-seconds", type=float, default=15.0)
    p.add_argument("--hold-leases", type=float, default=4.0, help="hold at least this many lease lengths")
    p.add_argument("--min-rounds", type=int, default=2, help="and until B has made this many rounds")
    p.add_argument("--b-threads", type=int, default=32, help="box B's concurrent attempts in a sweep")
    p.add_argument("--b-sample", type=int, default=0, help="shards B tries a round (0: every shard)")
    p.add_argument("--pause-shards", type=int, default=100, help="shards of the pause test")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    FaultProxy = support("faults").FaultProxy
    S3Server = support("s3_server").S3Server
    from sparkbatch_dagster.home import open_home
    from sparkbatch_dagster.home.bucket import Bucket
    from sparkbatch_dagster.home.layout import shard_key
    from sparkbatch_dagster.home.lease import KEEPER, read_json
    from sparkbatch_dagster.run.claims import Claims

    said = Said()
    logging.getLogger("sparkbatch").addHandler(said)
    logging.getLogger("sparkbatch").propagate = False
    load_at_start = os.getloadavg()[0]
    L, n = args.lease_seconds, args.shards
    server = S3Server.start()
    for k, v in server.env().items():
        if k != "AWS_ENDPOINT_URL":  # every request of the boxes goes through their proxy
            os.environ[k] = v
    bucket = server.new_bucket("leases")
    url = f"s3://{bucket}/job"
    tmp = Path(tempfile.mkdtemp(prefix="lease-scaling-"))
    pa, pb = FaultProxy(server.endpoint_url), FaultProxy(server.endpoint_url)
    for proxy in (pa, pb):
        proxy.set(delay_rate=1.0, delay_s=args.latency_ms / 1000)

    def home(name: str, proxy: FaultProxy) -> Any:
        # B's pool is wider than botocore's 10 connections, so that its threads really overlap.
        opts = {"client_kwargs": {"endpoint_url": proxy.url, "region_name": server.region},
                "config_kwargs": {"max_pool_connections": max(args.b_threads, 10)}}
        return open_home(url, tmp / name, storage_options=opts, lease_seconds=L)

    home_a, home_b = home("box-a", pa), home("box-b", pb)
    keys = [shard_key(i) for i in range(n)]
    out: dict[str, Any] = {"benchmark": "lease_scaling", "shards": n, "injected_latency_ms": args.latency_ms,
                           "lease_seconds": L, "renew_every_s": round(L / 3, 3)}

    # 1. Box A takes every claim, the way a run does.
    claims_a = Claims(home_a, VERSION, keys)
    t = time.perf_counter()
    mine, leased = claims_a.take()
    out["claim_take_s"] = round(time.perf_counter() - t, 1)
    assert len(mine) == n and not leased, f"box A got {len(mine)} of {n} shards ({len(leased)} leased)"
    box_a = claims_a.locks[keys[0]].lease.box  # type: ignore[union-attr]
    out["claim_take_requests"] = len(pa.log)
    out["claim_take_ms_per_shard"] = round(out["claim_take_s"] * 1000 / n, 1)
    print(f"A took {n} claims in {out['claim_take_s']} s ({len(pa.log)} requests)", file=sys.stderr, flush=True)

    # 2. A holds; B sweeps until the hold has lasted long enough, finishing the sweep it is in.
    start_a, start_b, t = len(pa.log), len(pb.log), time.perf_counter()
    attempts = taken = rounds = 0
    sweep_s: list[float] = []
    while time.perf_counter() - t < args.hold_leases * L or rounds < args.min_rounds:
        s = time.perf_counter()
        tried = random.sample(keys, args.b_sample) if args.b_sample else random.sample(keys, n)
        a, got = sweep(home_b, tried, args.b_threads)
        attempts, taken, rounds = attempts + a, taken + got, rounds + 1
        sweep_s.append(round(time.perf_counter() - s, 1))
        print(f"B round {rounds}: {a} attempts in {sweep_s[-1]} s, {got} taken", file=sys.stderr, flush=True)
    hold_s = time.perf_counter() - t
    log_a, log_b = pa.log[start_a:], pb.log[start_b:]
    box_path = f"leases/boxes/{box_a.rel.rsplit('/', 1)[1]}"
    renewals = requests(log_a, box_path)
    minutes = hold_s / 60
    old_per_min = n * 2 * (3 / L) * 60
    out.update({
        "hold_s": round(hold_s, 1), "hold_lease_lengths": round(hold_s / L, 2),
        "renewal_requests": sum(renewals.values()), "renewal_requests_by_method": renewals,
        "renewal_requests_per_min": round(sum(renewals.values()) / minutes, 2),
        "claim_requests_during_hold": sum(requests(log_a, f"leases/{VERSION}/").values()),
        "box_a_requests_during_hold": len(log_a),
        "old_design_requests_per_min": round(old_per_min, 1),
        "old_design_sequential_cycle_s": round(n * 2 * args.latency_ms / 1000, 1),
        "b_mode": f"sample of {args.b_sample} a round" if args.b_sample else "every shard each round",
        "b_threads": args.b_threads, "b_rounds": rounds, "b_round_s": sweep_s, "b_attempts": attempts,
        "b_requests_during_hold": len(log_b), "b_requests_per_attempt": round(len(log_b) / attempts, 2),
        "shards_taken_over_while_live": taken,
        "box_a_fenced_during_hold": box_a.fenced,
    })
    out["renewal_reduction"] = round(old_per_min / out["renewal_requests_per_min"], 1)
    print(f"hold {hold_s:.0f} s: A's box lease {renewals} ({out['renewal_requests_per_min']}/min), "
          f"claims {out['claim_requests_during_hold']}, B took {taken} of {attempts}", file=sys.stderr, flush=True)

    # 3. A releases every claim, the way a run ends; then its box lease goes too.
    t, before = time.perf_counter(), len(pa.log)
    claims_a.release_all()
    out["release_s"] = round(time.perf_counter() - t, 1)
    out["release_requests"] = len(pa.log) - before
    out["release_ms_per_shard"] = round(out["release_s"] * 1000 / n, 1)
    left = left_under_leases(server, bucket)
    b_box = f"leases/boxes/{home_b.partition_lock(VERSION, keys[0]).lease.box.rel.rsplit('/', 1)[1]}"  # type: ignore[union-attr]
    out["leases_left_after_release"] = sum(not name.endswith(b_box) for name in left)
    # B tried and got nothing: its box lease lives on (renewed) while its process does.
    out["b_box_lease_left_after_release"] = sum(name.endswith(b_box) for name in left)

    # 4. Pause: A stops renewing past its expiry; B takes its shards over; A learns it lost them.
    sample = sorted(random.sample(keys, min(args.pause_shards, n)))
    again = Claims(home_a, VERSION, sample)
    assert len(again.take()[0]) == len(sample)
    KEEPER.remove(box_a)
    paused = time.perf_counter()
    # The keeper may be in a tick that still renews A once: wait until the expiry stops moving.
    direct = Bucket(url, {"client_kwargs": {"endpoint_url": server.endpoint_url}})
    seen = None
    while True:
        expires = float((read_json(direct, box_a.rel)[0] or {}).get("expires", 0.0))
        if expires == seen and time.time() > expires + 0.5:
            break
        seen = expires
        time.sleep(max(expires - time.time(), 0.0) + 1.0)
    claims_b = Claims(home_b, VERSION, sample)
    t, before = time.perf_counter(), len(pb.log)
    got_b, still = claims_b.take()
    takeover_s, pause_s = time.perf_counter() - t, time.perf_counter() - paused
    takeover_log = pb.log[before:]
    renewed = box_a.renew()
    lost = sum(lock.lost for lock in again.locks.values())
    claims_b.release_all()
    again.release_all()
    out["takeover_after_pause"] = {
        "shards": len(sample), "paused_s": round(pause_s, 1), "taken_by_b": len(got_b), "refused": len(still),
        "takeover_s": round(takeover_s, 1), "takeover_requests": len(takeover_log),
        "takeover_requests_by_method": requests(takeover_log, ""),
        "takeover_ms_per_shard": round(takeover_s * 1000 / len(sample), 1),
        "a_renew_returned": renewed, "a_claims_lost": lost, "said_took_over": said.count("took over the lease"),
        "leases_left_after": len(left_under_leases(server, bucket)),
        "ok": len(got_b) == len(sample) and not renewed and lost == len(sample)}
    out["said_renewal_failed"] = sum(line.startswith("renewing ") for line in said.lines)
    out["machine"] = machine(cpu_only=True)
    out["load_avg_1m_at_start"] = round(load_at_start, 1)  # the box is shared: other work ran alongside
    out["store"] = "moto S3 server on loopback, s3fs client, one FaultProxy per box"
    out["command"] = " ".join(["python", *sys.argv])
    for proxy in (pa, pb):
        proxy.stop()
    server.stop()
    shutil.rmtree(tmp, ignore_errors=True)
    emit(out, args.out)
    tp = out["takeover_after_pause"]
    print(f"{n} shards, {args.latency_ms:g} ms a request, lease {L:g} s: box renewals "
          f"{out['renewal_requests_per_min']}/min vs {old_per_min:,.0f}/min before ({out['renewal_reduction']}x "
          f"fewer); claims took {out['claim_take_s']} s, released in {out['release_s']} s; live shards taken "
          f"{taken}/{attempts}; left {out['leases_left_after_release']}; pause: B took {tp['taken_by_b']}/"
          f"{tp['shards']}, A renew {tp['a_renew_returned']}", file=sys.stderr)


if __name__ == "__main__":
    main()
