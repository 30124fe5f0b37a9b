"""engines/platform/heap.py: the heap frozen while a run generates and handed back after, whoever froze it before."""

import gc
import threading
import weakref

import pytest

from sparkbatch_dagster.engines import FakeEngine
from sparkbatch_dagster.engines.platform import heap
from sparkbatch_dagster.engines.platform.heap import frozen_heap
from sparkbatch_dagster.testing import label_shard
from testkit import make_rows, one_shard


@pytest.fixture(autouse=True)
def unfrozen():
    """Each test starts from a heap nobody froze (Python 3.12 starts with some objects frozen)."""
    before = gc.get_freeze_count()
    if before:
        gc.unfreeze()
    yield
    assert gc.get_freeze_count() == 0, "a test left the heap frozen"
    if before:
        gc.freeze()


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_the_heap_is_frozen_inside_and_what_the_block_makes_is_still_collected():
    with frozen_heap():
        assert gc.get_freeze_count() > 0
        made_inside = _Cycle()
        gone = weakref.ref(made_inside)
        del made_inside
        gc.collect()
        assert gone() is None
    assert gc.get_freeze_count() == 0


def test_garbage_frozen_with_the_heap_is_collected_after_the_block():
    old = _Cycle()
    gone = weakref.ref(old)
    with frozen_heap():
        del old  # a cycle: only the collector frees it, and it cannot see frozen objects
        gc.collect()
        assert gone() is not None
    gc.collect()
    assert gone() is None


def test_holders_nest_and_overlap_and_the_last_one_unfreezes():
    inside, leave = threading.Barrier(2), threading.Event()

    def other() -> None:
        with frozen_heap():
            inside.wait()
            leave.wait()

    with frozen_heap():
        t = threading.Thread(target=other)
        t.start()
        inside.wait()
        with frozen_heap():
            pass
        assert gc.get_freeze_count() > 0  # the nested holder left, two remain
    assert gc.get_freeze_count() > 0  # the thread still holds it
    leave.set()
    t.join()
    assert gc.get_freeze_count() == 0


def test_a_heap_frozen_before_is_frozen_with_the_rest_and_handed_back():
    # Python 3.12 starts with a few hundred objects frozen: a run still freezes everything else.
    gc.freeze()
    made_after = _Cycle()
    with frozen_heap():
        assert gc.get_freeze_count() > 0
        gone = weakref.ref(made_after)
        del made_after
        gc.collect()
        assert gone() is not None  # frozen by the run, not only by the earlier freeze
    gc.collect()
    assert gone() is None and gc.get_freeze_count() == 0


def test_with_the_collector_off_nothing_is_frozen():
    gc.disable()
    try:
        with frozen_heap():
            assert gc.get_freeze_count() == 0
    finally:
        gc.enable()


def _full_passes_while_keeping(n: int) -> int:
    """Full collections while `n` small objects pile up and stay alive, as a run's in-flight
    requests and answers do."""
    seen = []

    def note(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            seen.append(1)

    with frozen_heap():
        # Python weighs what piles up against the oldest generation at its last full pass: one
        # now counts only what is not frozen (what the rest of the test session made weighs nothing).
        gc.collect()
        gc.callbacks.append(note)
        try:
            kept = [[i] for i in range(n)]
        finally:
            gc.callbacks.remove(note)
    assert len(kept) == n
    return len(seen)


def test_while_frozen_full_passes_are_spaced_out_and_the_thresholds_come_back(monkeypatch):
    before = gc.get_threshold()
    with frozen_heap():
        with frozen_heap():
            pass
        assert gc.get_threshold() == (before[0], before[1], before[2] * heap.FULL_PASS_SPACING)
    assert gc.get_threshold() == before
    # What the spacing is for: with the old heap frozen, Python's own rule makes full passes over
    # the run's objects as they pile up.
    monkeypatch.setattr(heap, "FULL_PASS_SPACING", 1)
    assert _full_passes_while_keeping(200_000) > 0
    monkeypatch.setattr(heap, "FULL_PASS_SPACING", 10)
    assert _full_passes_while_keeping(200_000) == 0


class _Watching(FakeEngine):
    """Notes whether the heap was frozen while it answered."""

    def generate(self, requests, sampling, output):
        for result in super().generate(requests, sampling, output):
            self.frozen_seen = gc.get_freeze_count()
            yield result


def test_a_run_generates_with_the_heap_frozen_and_hands_it_back(tmp_path):
    spec, home = one_shard(tmp_path, make_rows(20))
    engine = _Watching()
    label_shard(spec, home, "0123456789abcdef", "shard-00000", engine)
    assert engine.requests_seen > 0 and engine.frozen_seen > 0
    assert gc.get_freeze_count() == 0
