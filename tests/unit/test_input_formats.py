"""Input formats are records (sparkbatch_dagster/inputs/formats.py): ``input_format``'s choices and
the records agree, ``auto`` tells each by its suffixes, and Arrow IPC / Feather, the format added as
one record, shards exactly as the same rows do from Parquet (the reference), bad bytes and all."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkbatch_dagster import InputError
from sparkbatch_dagster.home import JobHome
from sparkbatch_dagster.inputs import FORMATS, format_of
from sparkbatch_dagster.inputs.shards import build_shards
from sparkbatch_dagster.spec import JobSpec
from testkit import make_rows, make_spec, write_parquet


def _shard_rows(spec: JobSpec) -> dict[str, dict[str, Any]]:
    home = JobHome(spec.home_path)
    manifest = build_shards(spec, home)
    rows = [r for k in manifest["keys"] for r in pq.read_table(home.shard_path(k)).to_pylist()]
    assert len(rows) == manifest["rows"]
    return {r["row_id"]: r for r in rows}


def test_every_input_format_choice_is_one_record() -> None:
    choices = set(typing.get_args(JobSpec.model_fields["input_format"].annotation)) - {"auto"}
    assert choices == set(FORMATS), "a format named in spec/job_spec.py without a record, or a record without a name"
    told = [s for f in FORMATS.values() for s in f.suffixes]
    assert len(told) == len(set(told)), "one suffix, one format"


@pytest.mark.parametrize(("name", "fmt"), [(s, f.name) for f in FORMATS.values() for s in f.suffixes])
def test_auto_tells_a_format_by_its_suffixes(tmp_path: Path, name: str, fmt: str) -> None:
    for path in (f"in/rows{name}", f"in/ROWS{name.upper()}.gz", f"s3://b/rows{name}?version=2"):
        assert format_of(make_spec(tmp_path, input=path)).name == fmt


def test_a_name_no_format_tells_stops_naming_every_choice(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"cannot tell the format of input='in/rows.xlsx': set input_format to one "
                                         r"of parquet, csv, json, arrow$"):
        format_of(make_spec(tmp_path, input="in/rows.xlsx"))
    assert format_of(make_spec(tmp_path, input="in/rows.xlsx", input_format="arrow")).name == "arrow"


def _arrow(path: Path, table: pa.Table, chunk: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    feather.write_feather(table, path, compression="uncompressed", chunksize=chunk)
    return path


def test_an_arrow_file_shards_as_the_same_rows_do_from_parquet(tmp_path: Path) -> None:
    rows = make_rows(90)
    parquet = write_parquet(tmp_path / "p" / "rows.parquet", rows)
    arrow = _arrow(tmp_path / "a" / "rows.feather", pa.Table.from_pylist(rows), chunk=25)  # 4 record batches
    want = _shard_rows(make_spec(tmp_path / "p", input=str(parquet), shards=3))
    got = _shard_rows(make_spec(tmp_path / "a", input=str(arrow), shards=3))
    assert got == want and len(got) == 90
    home = JobHome(make_spec(tmp_path / "a", input=str(arrow), shards=3).home_path)
    assert home.read_manifest()["format"] == "arrow"


def test_an_arrow_value_that_is_not_utf8_is_an_error_row_and_the_rest_stay(tmp_path: Path) -> None:
    texts = pa.array([b"a fine text", b"bad \xff byte", b"another"], pa.binary()).view(pa.string())
    table = pa.table({"id": ["r1", "r2", "r3"], "text": texts, "gold": ["fruit", "fruit", "animal"]})
    got = _shard_rows(make_spec(tmp_path, input=str(_arrow(tmp_path / "in" / "rows.arrow", table)), shards=1))
    assert set(got) == {"r1", "r2", "r3"}
    assert got["r1"]["text"] == "a fine text" and got["r3"]["text"] == "another"
    assert got["r2"]["text"] is None
    assert got["r2"]["_input_error"] == "invalid_text: row 2: column 'text' is not valid UTF-8 (byte 0xFF at byte 5)"


def test_a_file_named_arrow_that_is_not_one_is_refused_naming_what_it_is(tmp_path: Path) -> None:
    src = write_parquet(tmp_path / "in" / "rows.parquet", make_rows(5))
    fake = tmp_path / "in" / "rows.arrow"
    fake.write_bytes(src.read_bytes())
    with pytest.raises(InputError) as info:
        build_shards(make_spec(tmp_path, input=str(fake)), JobHome(tmp_path / "home"))
    assert str(info.value) == (f"input file {fake} is not an Arrow IPC file (it is Parquet): set input_format to "
                               "match the file, or give a .arrow or .feather or .ipc file")
    csv = tmp_path / "in" / "rows.csv"
    _arrow(csv, pa.Table.from_pylist(make_rows(5)))
    with pytest.raises(InputError, match="is an Arrow IPC file, not CSV: set input_format='arrow'"):
        build_shards(make_spec(tmp_path, input=str(csv), home=str(tmp_path / "h2")), JobHome(tmp_path / "h2"))


_TEXT = st.one_of(st.none(), st.text(max_size=30))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(_TEXT, max_size=40), chunk=st.integers(1, 50), shards=st.integers(1, 4))
def test_property_arrow_shards_equal_parquet_shards(tmp_path_factory: pytest.TempPathFactory, texts: list[str | None],
                                                    chunk: int, shards: int) -> None:
    """Any rows (empty and NULL texts, any Unicode, any batch size, more shards than rows): the Arrow
    file's shards hold exactly the rows the same table's Parquet file gives (the oracle)."""
    tmp = tmp_path_factory.mktemp("fmt")
    table = pa.table({"id": [f"r{i}" for i in range(len(texts))], "text": pa.array(texts, pa.string()),
                      "gold": pa.array(["fruit"] * len(texts), pa.string())})
    parquet = tmp / "p" / "rows.parquet"
    parquet.parent.mkdir()
    pq.write_table(table, parquet)
    arrow = _arrow(tmp / "a" / "rows.arrow", table, chunk=chunk)
    want = _shard_rows(make_spec(tmp / "p", input=str(parquet), shards=shards))
    got = _shard_rows(make_spec(tmp / "a", input=str(arrow), shards=shards))
    assert got == want
    assert sorted(got) == sorted(f"r{i}" for i in range(len(texts)))
