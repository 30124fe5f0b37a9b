"""The machine's heavy-test slot (tests/support/heavy.py): a second holder waits for the first."""

from __future__ import annotations

import threading

from heavy import heavy_slot


def test_a_second_heavy_test_waits_for_the_first_and_then_runs(tmp_path):
    path = tmp_path / "heavy.lock"
    said: list[str] = []
    waiting, first_done, second_in = threading.Event(), threading.Event(), threading.Event()

    def second() -> None:
        def say(line: str) -> None:
            said.append(line)
            waiting.set()

        # Its own open of the file: flock counts per open file, as a second session's would.
        with heavy_slot(path, say):
            assert first_done.is_set(), "the second holder got in while the first held the slot"
            second_in.set()

    with heavy_slot(path, said.append) as waited:
        assert waited < 60 and said == []  # free: taken at once, nothing said
        other = threading.Thread(target=second)
        other.start()
        assert waiting.wait(60), "the second holder did not wait"
        assert not second_in.is_set()
        assert "pid " in path.read_text()  # who holds it, for the waiter's message
        first_done.set()
    other.join(60)
    assert second_in.is_set()
    assert "held by: pid" in said[0]
