"""The tests of tests/unit/test_bucket_parts.py that start processes: the CLI, Dagster runs (their
log capture), servers, kills. That file says what they cover."""

from __future__ import annotations

import json
import time

import pytest

from sparkbatch_dagster.errors import ConfigError
from sparkbatch_dagster.home import Bucket
from sparkbatch_dagster.home.lease import KEEPER, BoxLease, Claim
from sparkbatch_dagster.run.result_store import ResultStore, prompt_key


def test_conditional_create_refuses_a_second_writer(s3_bucket):
    b = Bucket(f"s3://{s3_bucket}/job")
    assert b.put_bytes("commits/a.json", b"1", create=True)
    assert not b.put_bytes("commits/a.json", b"2", create=True)
    assert b.get_bytes("commits/a.json") == b"1"
    assert b.get_bytes("commits/none.json") is None


def _box(b: Bucket, seconds: float, said: list[str] | None = None, skew: float = 0.0) -> BoxLease:
    box = BoxLease(b, seconds=seconds, say=(said.append if said is not None else lambda _: None))
    box.clock = lambda: time.time() + skew  # type: ignore[method-assign]
    return box


def test_a_live_claim_is_refused_and_a_dead_box_fenced_then_taken_over(s3_bucket):
    b = Bucket(f"s3://{s3_bucket}/job")
    said: list[str] = []
    a, b_box = _box(b, 30.0, said), _box(b, 30.0, said)
    first = Claim(b, "leases/v/shard-00000.json", a)
    second = Claim(b, "leases/v/shard-00000.json", b_box)
    assert first.acquire(wait=False)
    assert not second.acquire(wait=False)  # its box lives: not taken
    assert second.holder() == a.owner
    assert b.get_bytes(b_box.rel) is None  # b took nothing: it leaves no box lease behind
    # box a stops renewing (paused, or dead) and b's clock passes its expiry (no wall-clock wait):
    # b fences a's lease, takes the claim, and says so.
    KEEPER.remove(a)
    b_box.clock = lambda: time.time() + 1000  # type: ignore[method-assign]
    assert second.acquire(wait=True, poll_s=0.1)
    assert any(f"took over the lease of {a.owner}" in s for s in said)
    # a's lease was fenced (a tombstone naming b), then removed once its claim was b's.
    assert b.get_bytes(a.rel) is None
    old = a.owner
    # box a comes back: its renewal finds no lease of its own, every claim it held is lost at once.
    assert not a.renew()
    assert a.fenced and first.lost and not PartitionLockless(first).confirm()
    assert any("took over its shards" in s for s in said)
    first.release()  # not ours any more: left alone
    assert json.loads(b.get_bytes("leases/v/shard-00000.json") or b"{}")["owner"] == b_box.owner
    second.release()  # the last claim of box b: its box lease goes too
    assert b.get_bytes("leases/v/shard-00000.json") is None
    assert b.get_bytes(b_box.rel) is None
    # box a lives on under a new identity: a new claim works.
    again = Claim(b, "leases/v/shard-00000.json", a)
    assert again.acquire(wait=False) and not again.lost and a.owner != old
    again.release()


class PartitionLockless:
    """A claim seen through a PartitionLock's confirm(), with no local lock."""

    def __init__(self, claim: Claim) -> None:
        self.claim = claim

    def confirm(self) -> bool:
        return self.claim.box.confirm() and not self.claim.lost


def test_a_box_that_renews_in_time_is_never_fenced(s3_bucket):
    b = Bucket(f"s3://{s3_bucket}/job")
    holder, other = _box(b, 30.0), _box(b, 30.0)
    mine = Claim(b, "leases/v/shard-00001.json", holder)
    theirs = Claim(b, "leases/v/shard-00001.json", other)
    assert mine.acquire(wait=False)
    # The other box's clock runs 9.9 s ahead (inside the documented bound, a third of 30 s): the
    # live lease still has over two thirds of its length left in its eyes after each renewal.
    other.clock = lambda: time.time() + 9.9  # type: ignore[method-assign]
    for _ in range(5):
        holder.renew()
        assert not theirs.acquire(wait=False)
    assert not mine.lost and not holder.fenced
    mine.release()


def test_renewal_is_one_request_per_box_whatever_the_shards_it_holds(s3_bucket):
    b = Bucket(f"s3://{s3_bucket}/job")
    box = _box(b, 30.0)
    claims = [Claim(b, f"leases/v/shard-{i:05d}.json", box) for i in range(40)]
    for c in claims:
        assert c.acquire(wait=False)
    writes: list[str] = []
    real = b.put_tagged

    def counted(rel: str, data: bytes, **kw: object) -> str | None:
        writes.append(rel)
        return real(rel, data, **kw)  # type: ignore[arg-type]

    b.put_tagged = counted  # type: ignore[method-assign]
    assert box.renew()
    assert writes == [box.rel]  # one conditional PUT renews all 40 claims
    for c in claims:
        c.release()
    assert not b.list("leases")


def test_two_boxes_share_one_answer_store_through_the_bucket(s3_bucket, tmp_path, monkeypatch):
    monkeypatch.setattr("sparkbatch_dagster.run.result_store.FAN_IN", 4)
    remote = Bucket(f"s3://{s3_bucket}/results")
    a = ResultStore(tmp_path / "box-a", "ctx", remote)
    b = ResultStore(tmp_path / "box-b", "ctx", remote)

    def answers(lo: int, hi: int) -> list[dict]:
        return [{"prompt_key": prompt_key("", f"q{i}"), "output": f"a{i}", "error": None, "prompt_tokens": 1,
                 "output_tokens": 1, "model": "m"} for i in range(lo, hi)]

    for n in range(5):  # box a: 5 segments, merged 4 at a time (the merged one up before its inputs go)
        a.add(answers(n * 10, n * 10 + 10))
    listed = sorted(remote.list("ctx"))
    assert sum(n.startswith("seg-L1-") for n in listed) == 1 and sum(n.startswith("seg-L0-") for n in listed) == 1
    keys = [prompt_key("", f"q{i}") for i in range(60)]
    found = b.lookup(keys)  # box b: an empty cache, every answer box a stored
    assert len(found) == 50 and found[prompt_key("", "q7")] == ("a7", None, None, "m", None, None, False, None)
    assert sorted(f.name for f in b.segments()) == listed


def test_a_missing_bucket_and_bad_keys_are_one_line_each(s3_server, monkeypatch):
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError) as missing:
        Bucket("s3://no-such-bucket-here/job").check()
    assert str(missing.value).startswith("home s3://no-such-bucket-here/job: bucket 'no-such-bucket-here' does not "
                                         "exist") and "\n" not in str(missing.value)
    bucket = s3_server.new_bucket()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(ConfigError) as refused:
        Bucket(f"s3://{bucket}/job").check()
    assert f"home s3://{bucket}/job: the store refused these credentials" in str(refused.value)
    assert "wrong" not in str(refused.value) and "\n" not in str(refused.value)
