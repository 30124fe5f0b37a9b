"""engines/heap.py: the heap frozen while a run generates and handed back after, whoever froze it before."""

import gc
import threading
import weakref

import pytest

from conftest import make_rows, one_shard
from sparkbatch_dagster.engines import FakeEngine, heap
from sparkbatch_dagster.engines.heap import frozen_heap
from sparkbatch_dagster.run.runner import label_shard


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


def test_disabled_or_with_the_collector_off_nothing_is_frozen(monkeypatch):
    monkeypatch.setattr(heap, "ENABLED", False)
    with frozen_heap():
        assert gc.get_freeze_count() == 0
    monkeypatch.setattr(heap, "ENABLED", True)
    gc.disable()
    try:
        with frozen_heap():
            assert gc.get_freeze_count() == 0
    finally:
        gc.enable()


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
