"""The body cap bounds the server's memory (issue 59): a 32 MiB file of short lines uploaded,
created as a batch and validated to its last line, and a 32 MiB Message Batches create checked
to its last request, grow ``serve-batch`` by less than the bytes sent (before: 2.3x and 2.9x;
the file was read whole and split into lines, the create parsed whole into objects).

Measured in the server's own process: its peak resident memory (``VmHWM``, reset before each
step through ``/proc/<pid>/clear_refs``) less its resident memory before the step. No timing
decides anything: each step waits for the state the server reports. The same at 500 MiB:
``benchmarks/server/upload_memory.py`` (docs/batch-files.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.server.upload_memory import measure

if not Path("/proc/self/clear_refs").exists():  # pragma: no cover - Linux only
    pytest.skip("needs Linux's /proc", allow_module_level=True)


def test_a_big_upload_and_create_grow_the_server_by_less_than_their_size(tmp_path: Path) -> None:
    got = measure(tmp_path, 32 * 1024 * 1024, 20_000)
    openai, anthropic = got["openai"], got["anthropic"]
    assert openai["lines"] > 250_000
    assert openai["upload_growth_mb"] < 0.5 * openai["file_mb"], got
    assert openai["create_and_validate_growth_mb"] < 0.5 * openai["file_mb"], got
    assert anthropic["growth_mb"] < 2 * anthropic["body_mb"], got
    assert anthropic["answer"].startswith("requests.19999.params.max_tokens:")
