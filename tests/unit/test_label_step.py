"""The labeling step's time in named parts, and the engine start overlapped with the run's own work.

Fake engines throughout; every wait is on an event the code under test sets (a shard opened, the
start returned), never on the clock: a bounded wait only keeps a broken build from hanging.
"""

from __future__ import annotations

import threading

import pytest

from sparkbatch_dagster import EngineError, SparkbatchError
from sparkbatch_dagster.engines import FakeEngine, LazyEngine
from sparkbatch_dagster.engines.platform.spans import Spans
from sparkbatch_dagster.home import JobHome
from sparkbatch_dagster.inputs.shards import build_shards
from sparkbatch_dagster.run.checkpoint import FlushTimer
from sparkbatch_dagster.run.feed import Feed
from sparkbatch_dagster.run.runner import ShardRun
from testkit import make_spec, unique_rows, write_parquet

V = "0123456789abcdef"
#: Bounds a wait for an event that a broken build never sets: it fails the test instead of hanging it.
HANG_S = 120.0


def _job(tmp_path, n=80, shards=4):
    write_parquet(tmp_path / "in" / "rows.parquet", unique_rows(n))  # every prompt distinct: one request a row
    spec = make_spec(tmp_path, n=n, shards=shards)
    home = JobHome(spec.home_path)
    build_shards(spec, home)
    return spec, home, sorted(p.stem for p in home.shards_dir.glob("shard-*.parquet"))


class Opened(ShardRun):
    """A run that says when it has opened ``count`` shards (from whichever call opened them)."""

    def __init__(self, *args, count: int = 2, **kwargs):
        super().__init__(*args, **kwargs)
        self.count, self.enough = count, threading.Event()

    def open(self, key):
        idx = super().open(key)
        if len(self.shards) >= self.count:
            self.enough.set()
        return idx


def _committed(home, keys):
    return [k for k in keys if home.labeled_path(V, k).exists() or home.stats_path(V, k).exists()]


def test_a_part_inside_another_is_counted_once_and_a_covering_part_takes_the_time_it_covers():
    spans = Spans(base="prepare")
    spans.push("generation")
    with spans.span("render"):
        pass
    spans.switch("answers")
    spans.push("engine_start", cover=True)
    with spans.span("read_shards"):  # done while the engine started: it costs nothing
        pass
    spans.cover_until(0.0)  # the start ended long ago: what follows is the step's own again
    with spans.span("store_lookup"):
        pass
    spans.pop()
    spans.pop()
    assert set(spans.seconds) >= {"prepare", "generation", "render", "answers", "engine_start", "store_lookup"}
    assert "read_shards" not in spans.seconds and "read_shards" in spans.overlapped
    assert sum(spans.seconds.values()) == pytest.approx(spans.last - spans.began)
    elsewhere = threading.Thread(target=lambda: (spans.push("elsewhere"), spans.pop()))
    elsewhere.start()
    elsewhere.join()
    assert "elsewhere" not in spans.seconds and spans._stack == []  # another thread's work is not the step's


# --- the start in the background -----------------------------------------------------------------


def test_the_next_shards_are_opened_while_the_engine_starts(tmp_path):
    """The engine's start holds until the run has opened the shard after the first: with the start
    on the run's own thread that never happens (the test fails at its bound instead of passing)."""
    spec, home, keys = _job(tmp_path)
    seen: dict[str, object] = {}

    def start():
        seen["opened"] = run.enough.wait(HANG_S)
        seen["committed"] = _committed(home, keys)  # opening ahead commits nothing
        return FakeEngine()

    engine = LazyEngine("fake-model", start)
    run = Opened(spec, home, V, engine, count=2)
    stats = run.run(keys)
    assert seen == {"opened": True, "committed": []}
    assert sorted(s.partition for s in stats) == keys and _committed(home, keys) == keys
    assert sum(s.generated_requests for s in stats) == 80
    assert {"read_shards", "render", "store_lookup"} <= engine.spans.overlapped.keys()


def test_opening_ahead_stops_at_its_row_bound(tmp_path):
    spec, home, keys = _job(tmp_path, n=80, shards=4)
    run = ShardRun(spec, home, V, FakeEngine())
    with FlushTimer(60.0) as timer:
        run._timer = timer
        feed = Feed(run, keys, ahead_rows=1)
        assert feed.meanwhile() and not feed.meanwhile()  # one shard ahead: its rows reach the bound
        assert len(run.shards) == 1
        roomy = Feed(run, keys[1:], ahead_rows=10_000)
        while roomy.meanwhile():
            pass
        assert len(run.shards) == 4  # every shard open: nothing left to open ahead


def test_a_start_that_fails_raises_its_own_error_with_nothing_committed(tmp_path):
    spec, home, keys = _job(tmp_path)
    # The last shard's answers are stored already (a first run labeled it): all reused, nothing to
    # generate. Opened ahead during the failing start, it must still not be committed.
    label = ShardRun(spec, home, V, FakeEngine())
    label.run([keys[-1]])
    home.labeled_path(V, keys[-1]).unlink()
    home.stats_path(V, keys[-1]).unlink()
    segments = sorted(p.name for p in tmp_path.rglob("seg-*.parquet"))
    assert segments  # the last shard's answers

    def start():
        assert run.enough.wait(HANG_S)
        raise EngineError("vLLM could not start model 'm': no GPU today. Fix: check the model")

    run = Opened(spec, home, V, LazyEngine("fake-model", start), count=len(keys))
    with pytest.raises(EngineError, match="no GPU today"):
        run.run(keys)
    assert _committed(home, keys) == []
    assert sorted(p.name for p in tmp_path.rglob("seg-*.parquet")) == segments  # no answer stored


def test_a_shard_that_fails_to_open_ahead_fails_where_it_always_did(tmp_path):
    """Opened ahead while the engine starts, the second shard fails: the first shard is still
    labeled and committed, and the run fails when the second one's turn comes, with its error."""
    spec, home, keys = _job(tmp_path)
    tried = threading.Event()

    class Unreadable(ShardRun):
        def open(self, key):
            if key == keys[1]:
                tried.set()
                raise SparkbatchError(f"{key} is unreadable")
            return super().open(key)

    def start():
        assert tried.wait(HANG_S)  # the failing open ahead came first
        return FakeEngine()

    run = Unreadable(spec, home, V, LazyEngine("fake-model", start))
    with pytest.raises(SparkbatchError, match=f"{keys[1]} is unreadable"):
        run.run(keys)
    assert _committed(home, keys) == keys[:1]


def test_a_run_whose_answers_are_all_stored_starts_no_engine(tmp_path):
    spec, home, keys = _job(tmp_path)
    ShardRun(spec, home, V, FakeEngine()).run(keys)
    for key in keys:  # outputs lost; their answers are still in the result store
        home.labeled_path(V, key).unlink()
        home.stats_path(V, key).unlink()

    def start():
        raise AssertionError("no prompt needed generating: no engine may start")

    engine = LazyEngine("fake-model", start)
    stats = ShardRun(spec, home, V, engine).run(keys)
    assert engine.started is None and "engine_start" not in engine.spans.seconds
    assert sum(s.reused_rows for s in stats) == 80 and sum(s.generated_requests for s in stats) == 0
    assert _committed(home, keys) == keys


def test_an_engine_of_another_identity_stops_the_run_with_nothing_stored(tmp_path):
    spec, home, keys = _job(tmp_path)

    def start():
        assert run.enough.wait(HANG_S)  # shards opened ahead meanwhile
        return FakeEngine(model_id="other-model")

    run = Opened(spec, home, V, LazyEngine("fake-model", start), count=len(keys))
    with pytest.raises(EngineError, match="answers as other-model"):
        run.run(keys)
    assert _committed(home, keys) == []
    assert not list(tmp_path.rglob("seg-*.parquet")) and not list(tmp_path.rglob("part-*.parquet"))


# --- rendering --------------------------------------------------------------------------------


@pytest.mark.parametrize("template", [
    "Package: {{ package }}\nDescription: {{ description }}\n\nWhich section?", "{{a}}{{b}}", "x {{- a -}} y",
    "  {{ a }}  \n", "line\n\n", "", "plain text", "{# note #}x{{ a }}", "{% raw %}{{ a }}{% endraw %}",
    "tab\t{{a}}\r\n{{b}}", "{{a}} {{a}}", "{{ a|upper }}", "{% if a %}{{ a }}{% endif %}", "{{ 'x' }}",
])
def test_a_template_renders_as_jinja_renders_it(template):
    """Templates that only put columns into text are joined, not run through Jinja: same text."""
    from sparkbatch_dagster.spec.prompts import _compiled, render

    for values in ({"a": "A {{ x }}", "b": "é\n", "package": "p", "description": "d"},
                   {"a": "", "b": " ", "package": "{% raw %}", "description": "}}"}):
        assert render(template, template, values).user == _compiled(template).render(values)
