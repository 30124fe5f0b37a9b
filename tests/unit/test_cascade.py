"""A cascade of models (``JobSpec.cascade``): the first stage answers every row, the rows it is
unsure of go to the next. Fake engines here (their confidence a hash of model and prompt); the
real engines (SmolLM2 then Gemma 3 270M) in test_cascade_real.py."""


import pyarrow.parquet as pq
import pytest

from sparkbatch_dagster import ConfigError, EngineError
from sparkbatch_dagster.engines import FakeEngine
from sparkbatch_dagster.run.cascade import CascadeEngine, Stage
from sparkbatch_dagster.run.result_store import open_store
from sparkbatch_dagster.testing import label_shard
from testkit import label_defs_yaml, make_rows, make_spec, one_shard, yaml_job_spec

CASCADE = [{"below": 0.5}, {"model": "big"}]


def test_a_crash_in_a_later_stage_resumes_without_asking_the_first_again(tmp_path):
    spec, home = one_shard(tmp_path, make_rows(40), cascade=CASCADE, checkpoint_rows=1)
    version = "00000000000000ca"

    def engine(big: FakeEngine) -> tuple[CascadeEngine, FakeEngine]:
        small = FakeEngine("small")
        stages = [Stage("small", lambda: small, lambda: None, 0.5, open_store(spec, home, "small")),
                  Stage("big", lambda: big, lambda: None, None, open_store(spec, home, "big"))]
        return CascadeEngine("cascade(small<0.5, big)", stages, spec), small

    broken, small = engine(FakeEngine("big", fail_after=3))
    with pytest.raises(EngineError):
        label_shard(spec, home, version, "shard-00000", broken)
    assert small.requests_seen > 0
    healed, small = engine(FakeEngine("big"))
    stats = label_shard(spec, home, version, "shard-00000", healed)
    assert small.requests_seen == 0  # its answers were stored as it gave them
    assert stats.rows == 40 and stats.resumed_rows > 0
    out = pq.read_table(home.labeled_path(version, "shard-00000")).to_pylist()
    assert sorted(r["row_id"] for r in out) == sorted(r["id"] for r in make_rows(40))  # each row once
    assert all(r["model"] == "big" or r["confidence"] >= 0.5 for r in out)


@pytest.mark.parametrize("cascade, says", [
    ([{"below": 0.5}], "one stage"),
    ([{"model": "a"}, {"model": "b"}], "below=None"),
    ([{"below": 0.5}, {"model": "b", "below": 0.2}], "nothing comes after it"),
    ([{"below": 1.5}, {"model": "b"}], "0 < below <= 1"),
    ([{"below": 0.5}, {"below": 0.5}, {}], "more than one"),
])
def test_a_wrong_cascade_stops_with_what_to_fix(tmp_path, cascade, says):
    with pytest.raises(ConfigError, match=says):
        make_spec(tmp_path, cascade=cascade)


def test_free_text_cannot_cascade(tmp_path):
    with pytest.raises(ConfigError, match="confidence"):
        make_spec(tmp_path, cascade=CASCADE, output={"kind": "text"})


def test_a_cascade_needs_the_confidence_on(tmp_path):
    with pytest.raises(ConfigError, match="output.confidence=True"):
        make_spec(tmp_path, cascade=CASCADE, output={"kind": "label", "labels": ["a", "b"], "confidence": False})


def test_a_cascade_travels_from_a_defs_yaml(tmp_path):
    text = label_defs_yaml(tmp_path, """\
        cascade:
          - below: 0.8
          - model: gemma-3-270m@quantization=fp8
    """)
    first, second = yaml_job_spec(text).cascade
    assert first.model is None and first.below == 0.8
    assert second.candidate().model == "gemma-3-270m" and second.candidate().engine_kwargs == {"quantization": "fp8"}


def test_shards_commit_as_the_run_goes_not_at_its_end(tmp_path):
    """Rounds of requests go through both stages in turn: the first shard is committed (and billed)
    before the first stage has seen the last shard's rows."""
    from sparkbatch_dagster.home import JobHome
    from sparkbatch_dagster.inputs.shards import build_shards
    from sparkbatch_dagster.run.runner import ShardRun

    spec = make_spec(tmp_path, n=80, shards=4, cascade=CASCADE)
    home = JobHome(spec.home_path)
    keys = build_shards(spec, home)["keys"]
    small, big = FakeEngine("small"), FakeEngine("big")
    stages = [Stage("small", lambda: small, lambda: None, 0.5), Stage("big", lambda: big, lambda: None, None)]
    engine = CascadeEngine("cascade(small<0.5, big)", stages, spec)
    engine.round = 10
    seen_at_commit = [small.requests_seen for _ in ShardRun(spec, home, "00000000000000cb", engine).stream(keys)]
    assert len(seen_at_commit) == 4 and seen_at_commit[0] < seen_at_commit[-1]
    assert big.requests_seen > 0  # and the second stage answered along the way
