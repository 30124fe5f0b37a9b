"""``current.json`` in a folder home (home/pointer.py): it moves to a version only while the input is
the one that version was labeled from, and a damaged pointer is derived from the commits without a
write. The bucket's conditional write under a slow store: tests/e2e/test_current_pointer.py."""

from __future__ import annotations

import json
import os

from sparkbatch_dagster.home import JobHome
from sparkbatch_dagster.home.pointer import Current, advance, read

V1, V2 = "00000000000000a1", "00000000000000b2"


def _home(tmp_path, signature: str) -> JobHome:
    home = JobHome(tmp_path / "home")
    home.shards_dir.mkdir(parents=True)
    home.manifest_path.write_text(json.dumps({"signature": signature, "keys": ["shard-00000"]}))
    return home


def _commit(home: JobHome, version: str, signature: str, mtime: float) -> None:
    stats = home.stats_path(version, "shard-00000")
    stats.parent.mkdir(parents=True)
    stats.write_text(json.dumps({"rows": 1, "model": "m", "input_signature": signature}))
    os.utime(stats, (mtime, mtime))


def test_the_pointer_moves_only_to_a_version_of_the_input_the_home_has(tmp_path):
    home = _home(tmp_path, "sig-1")
    assert advance(home, V1, "m", "sig-1") and read(home) == Current(V1, "m", "sig-1")
    home.manifest_path.write_text(json.dumps({"signature": "sig-2", "keys": ["shard-00000"]}))  # re-sharded
    assert advance(home, V1, "m", "sig-1")  # still current: nothing to write
    assert advance(home, V2, "m", "sig-2") and read(home) == Current(V2, "m", "sig-2")
    assert not advance(home, V1, "m", "sig-1") and read(home).version == V2  # and never back


def test_a_damaged_pointer_is_derived_from_the_commits_and_reading_writes_nothing(tmp_path):
    home = _home(tmp_path, "sig-2")
    _commit(home, V1, "sig-1", mtime=2_000)  # newest, but of an input the home no longer has
    _commit(home, V2, "sig-2", mtime=1_000)
    home.current_path.write_bytes(b'{"version": "00000000000')  # truncated
    assert read(home) == Current(V2, "m", "sig-2")
    assert home.current_path.read_bytes() == b'{"version": "00000000000'  # a read never writes the home
    assert advance(home, V2, "m", "sig-2") and json.loads(home.current_path.read_text())["version"] == V2


def test_without_any_commit_of_the_input_a_damaged_pointer_reads_as_none(tmp_path):
    home = _home(tmp_path, "sig-3")
    _commit(home, V1, "sig-1", mtime=1_000)
    home.current_path.write_bytes(b"\x00\x00")
    assert read(home) is None


def test_a_writer_heals_a_damaged_pointer_from_the_commits(tmp_path):
    from sparkbatch_dagster.home.pointer import heal

    home = _home(tmp_path, "sig-2")
    _commit(home, V2, "sig-2", mtime=1_000)
    assert not heal(home)  # no pointer yet: nothing to heal (the first commit writes it)
    home.current_path.write_bytes(b'{"vers')
    assert heal(home) and json.loads(home.current_path.read_text()) == {"version": V2, "model": "m",
                                                                         "signature": "sig-2"}
    assert not heal(home)  # whole now
