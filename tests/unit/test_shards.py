import json

import pyarrow.parquet as pq
import pytest

from sparkbatch_dagster import InputError
from sparkbatch_dagster.home import JobHome
from sparkbatch_dagster.inputs.shards import build_shards
from testkit import make_rows, make_spec, write_parquet


def _all_rows(home: JobHome, manifest) -> list[dict]:
    return [r for k in manifest["keys"] for r in pq.read_table(home.shard_path(k)).to_pylist()]


def test_every_row_lands_in_exactly_one_shard(tmp_path):
    spec = make_spec(tmp_path, n=300, shards=5)
    home = JobHome(spec.home_path)
    manifest = build_shards(spec, home)
    rows = _all_rows(home, manifest)
    assert manifest["rows"] == 300 and len(manifest["keys"]) == 5
    assert sorted(r["row_id"] for r in rows) == sorted(f"id-{i:05d}" for i in range(300))
    assert all(home.shard_path(k).exists() for k in manifest["keys"])


def test_sharding_is_stable_and_reused(tmp_path):
    spec = make_spec(tmp_path, n=100, shards=3)
    home = JobHome(spec.home_path)
    first = build_shards(spec, home)
    before = {k: pq.read_table(home.shard_path(k)).column("row_id").to_pylist() for k in first["keys"]}
    again = build_shards(spec, home)
    assert again["reused"] is True
    # Delete the manifest: resharding from scratch puts every row in the same shard.
    home.manifest_path.unlink()
    third = build_shards(spec, home)
    assert third["reused"] is False
    after = {k: pq.read_table(home.shard_path(k)).column("row_id").to_pylist() for k in third["keys"]}
    assert before == after


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_csv_and_jsonl_inputs_with_generated_ids(tmp_path, fmt):
    rows = make_rows(40)
    src = tmp_path / f"rows.{fmt}"
    if fmt == "csv":
        src.write_text("text,gold\n" + "".join(f'"{r["text"]}",{r["gold"]}\n' for r in rows))
    else:
        src.write_text("".join(json.dumps({"text": r["text"], "gold": r["gold"]}) + "\n" for r in rows))
    spec = make_spec(tmp_path, input=str(src), id_column=None, shards=2)
    home = JobHome(spec.home_path)
    manifest = build_shards(spec, home)
    got = _all_rows(home, manifest)
    assert len(got) == 40
    ids = {r["row_id"]: r["text"] for r in got}
    assert ids["row-0000000001"] == rows[0]["text"] and ids["row-0000000040"] == rows[39]["text"]


def test_glob_over_several_files(tmp_path):
    rows = make_rows(60)
    write_parquet(tmp_path / "many" / "a.parquet", rows[:25])
    write_parquet(tmp_path / "many" / "b.parquet", rows[25:])
    spec = make_spec(tmp_path, input=str(tmp_path / "many" / "*.parquet"), shards=2)
    assert build_shards(spec, JobHome(spec.home_path))["rows"] == 60


def test_fsspec_url_input(tmp_path):
    import fsspec

    fs = fsspec.filesystem("memory")
    with fs.open("memory://bucket/rows.parquet", "wb") as fh:
        import pyarrow as pa

        pq.write_table(pa.Table.from_pylist(make_rows(30)), fh)
    spec = make_spec(tmp_path, input="memory://bucket/rows.parquet", shards=2)
    assert build_shards(spec, JobHome(spec.home_path))["rows"] == 30


def test_missing_column_stops_early_with_the_fix(tmp_path):
    spec = make_spec(tmp_path, text_columns=["body"], user_template="{{ body }}")
    with pytest.raises(InputError, match=r"no column\(s\) \['body'\].*fix id_column/text_columns"):
        build_shards(spec, JobHome(spec.home_path))


def test_no_files_is_a_clear_error(tmp_path):
    spec = make_spec(tmp_path, input=str(tmp_path / "nothing" / "*.parquet"))
    with pytest.raises(InputError, match="matches no files"):
        build_shards(spec, JobHome(spec.home_path))


def test_bad_rows_are_kept_with_a_reason(tmp_path):
    rows = make_rows(20)
    rows[1]["id"] = rows[0]["id"]  # duplicate id
    rows[2]["id"] = None  # null id
    src = write_parquet(tmp_path / "bad" / "rows.parquet", rows)
    spec = make_spec(tmp_path, input=str(src), shards=2)
    home = JobHome(spec.home_path)
    got = {r["row_id"]: r for r in _all_rows(home, build_shards(spec, home))}
    assert len(got) == 20
    assert got["id-00000#dup2"]["_input_error"].startswith("duplicate_id")
    assert next(r for k, r in got.items() if k.startswith("null-id"))["_input_error"].startswith("null_id")


def test_nested_and_numeric_columns(tmp_path):
    rows = [{"id": str(i), "text": {"a": i}, "num": i * 1.5, "gold": "x"} for i in range(6)]
    src = write_parquet(tmp_path / "typed" / "rows.parquet", rows)
    spec = make_spec(tmp_path, input=str(src), text_columns=["text", "num"], user_template="{{ text }} {{ num }}")
    home = JobHome(spec.home_path)
    got = _all_rows(home, build_shards(spec, home))
    assert all(r["_input_error"].startswith("bad_type: column 'text'") for r in got)
    assert sorted(r["num"] for r in got)[1] == "1.5"
