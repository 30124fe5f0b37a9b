"""engines/server/handoff.py: coroutines started on a loop in another thread, a batch at a time, and
back as each finishes; batched or one at a time, the same results; a cancel stops the rest."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from sparkbatch_dagster.engines.server.handoff import BATCH, Handoff


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


async def double(x: int) -> int:
    return 2 * x


async def fail() -> None:
    raise ValueError("this one failed")


def collect(handoff: Handoff, n: int) -> dict[int, object]:
    got = {}
    while len(got) < n:
        finished = handoff.next_done(timeout=30)
        assert finished is not None, "a handed-off coroutine never finished"
        token, task = finished
        got[token] = task
    return got


@pytest.mark.parametrize("batched", [True, False])
def test_every_coroutine_comes_back_once_with_its_result(loop, batched):
    handoff = Handoff(loop, batched=batched)
    tokens = {handoff.add(double(i)): i for i in range(3 * BATCH + 5)}  # full batches go as they fill
    handoff.flush()
    got = collect(handoff, len(tokens))
    assert {token: task.result() for token, task in got.items()} == {t: 2 * i for t, i in tokens.items()}
    assert handoff.next_done(timeout=0.05) is None  # nothing twice


def test_what_a_coroutine_raises_is_raised_by_its_result(loop):
    handoff = Handoff(loop)
    token = handoff.add(fail())
    handoff.flush()
    got = collect(handoff, 1)
    with pytest.raises(ValueError, match="this one failed"):
        got[token].result()


def test_nothing_starts_before_a_flush_or_a_full_batch(loop):
    started = threading.Event()

    async def mark() -> None:
        started.set()

    handoff = Handoff(loop)
    handoff.add(mark())
    assert not started.wait(0.2)  # held: the caller may add more to the same wake-up
    handoff.flush()
    assert started.wait(30)


@pytest.mark.parametrize("batched", [True, False])
def test_cancel_stops_what_runs_and_closes_what_never_started(loop, batched):
    release = asyncio.Event()
    running = threading.Event()  # set when all ten are waiting: a task cancelled before it starts never runs
    started: list[int] = []
    cancelled: list[int] = []
    unwound = threading.Event()  # a future handed off alone is done once cancelled, before its task unwinds

    async def wait(i: int) -> None:
        started.append(i)
        if len(started) == 10:
            running.set()
        try:
            await release.wait()
        except asyncio.CancelledError:
            cancelled.append(i)
            if len(cancelled) == 10:
                unwound.set()
            raise

    handoff = Handoff(loop, batched=batched)
    for i in range(10):
        handoff.add(wait(i))
    handoff.flush()
    assert running.wait(30)
    never = wait(99)
    handoff.add(never)  # added, never flushed
    handoff.cancel()
    assert never.cr_frame is None  # closed: no "never awaited" warning when it is collected
    got = collect(handoff, 10)
    assert all(task.cancelled() for task in got.values())
    unwound.wait(30)
    assert sorted(cancelled) == list(range(10))
