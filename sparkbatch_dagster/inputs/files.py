"""Input files: the CSV dialect (DuckDB's sniffer, read options, delimiter hints), what a file that
cannot be read at all looks like, and physical lines with their UTF-8 checks."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import InputError

log = logging.getLogger("sparkbatch")

#: What a byte that is not UTF-8 becomes in a line decoded with ``surrogateescape`` (:func:`physical_lines`).
SURROGATE = re.compile("[\udc80-\udcff]")
#: The delimiters a CSV header is tried with, in order of preference.
DELIMITERS = (",", "\t", ";", "|")


@dataclass(frozen=True)
class Dialect:
    delimiter: str
    quote: str = '"'
    escape: str = '"'
    header: bool = True
    skip: int = 0
    comment: str = ""
    columns: tuple[str, ...] = ()


def lit(value: str) -> str:
    """A string as a SQL literal."""
    return "'" + value.replace("'", "''") + "'"


# ---------------------------------------------------------------------------------------------
# CSV dialect: DuckDB's sniffer, and the options the fast path reads with


def sniff(con: Any, file: str, delimiter: str | None) -> Dialect | None:
    """DuckDB's guess of the first file's dialect, or None when even the sniffer gives up."""
    extra = ", delim = getvariable('sb_delim')" if delimiter else ""
    con.execute("SET VARIABLE sb_one = ?", [file])
    con.execute("SET VARIABLE sb_delim = ?", [delimiter or ""])
    try:
        cur = con.execute(f"SELECT * FROM sniff_csv(getvariable('sb_one'), ignore_errors = true{extra})")
        names = [d[0].lower() for d in cur.description]
        row = dict(zip(names, cur.fetchone(), strict=True))
    except Exception as exc:  # noqa: BLE001 - any failure means: parse it ourselves
        log.info("DuckDB could not sniff %s: %s", file, str(exc).splitlines()[0])
        return None

    def char(key: str) -> str:
        v = row.get(key) or ""
        return "" if v in ("(empty)", "\\0", "\x00") else str(v)

    cols = tuple(str(c["name"]) for c in row.get("columns") or [])
    return Dialect(delimiter=char("delimiter") or ",", quote=char("quote"), escape=char("escape"),
                   header=bool(row.get("hasheader", True)), skip=int(row.get("skiprows") or 0),
                   comment=char("comment"), columns=cols)


def csv_options(dialect: Dialect | None, delimiter: str | None) -> str:
    """Extra read_csv options for the fast path. Values stay text as written (``all_varchar``:
    an id ``007`` stays ``007``, as it does when the slow path reads the same file). When the
    sniffer chose no quote character (it does so when a stray quote breaks its sample), the
    standard quote is forced with the sniffed delimiter and header: a stray quote then fails the
    read (and the slow path takes over) instead of every quoted value silently keeping its quotes."""
    opts = ["all_varchar = true"]
    if delimiter:
        opts.append(f"delim = {lit(delimiter)}")
    if dialect is not None and not dialect.quote:
        if not delimiter:
            opts.append(f"delim = {lit(dialect.delimiter)}")
        opts += ["quote = '\"'", "escape = '\"'", f"header = {str(dialect.header).lower()}"]
        if dialect.skip:
            opts.append(f"skip = {int(dialect.skip)}")
    return ", " + ", ".join(opts)


def delimiter_hint(columns: list[str], missing: list[str], used: str) -> str:
    """The end of a missing-column message for CSV: which delimiter the header seems to use."""
    for cand in DELIMITERS:
        if cand == used:
            continue
        split = {p.strip().strip('"') for c in columns for p in c.split(cand)}
        if len(split) > len(columns) and set(missing) <= split:
            return (f"the header looks {cand!r}-separated but was read with delimiter {used!r}: "
                    f"set csv_delimiter={cand!r} (or save the file with {used!r})")
    return (f"it was read as CSV with delimiter {used!r}: if the file uses another delimiter set "
            "csv_delimiter, else fix id_column/text_columns/gold_column")


# ---------------------------------------------------------------------------------------------
# Files that cannot be read at all


def _local(f: str) -> Path | None:
    if "://" in f and not f.startswith("file://"):
        return None
    return Path(f.removeprefix("file://"))


def open_binary(f: str) -> IO[bytes]:
    path = _local(f)
    compressed = f.lower().endswith((".gz", ".bz2", ".xz", ".zst", ".zstd"))
    try:
        if path is not None and not compressed:
            return path.open("rb")
        import fsspec

        return fsspec.open(f, "rb", compression="infer").open()  # type: ignore[no-any-return]
    except (OSError, ValueError, ImportError) as exc:
        raise InputError(f"cannot open input file {f}: {exc}") from None


def empty_files(files: list[str]) -> list[str]:
    """Local files of zero bytes (remote files are not stat'ed here)."""
    found = []
    for f in files:
        path = _local(f)
        if path is not None and path.is_file() and path.stat().st_size == 0:
            found.append(f)
    return found


#: Signatures of what a text file's name may hide, and the fix (``formats.diagnose``). Named right
#: (``.gz``, ``.zst``...), a compressed file is decompressed before it is read, so its head is text again.
SIGNATURES = (
    (b"\x1f\x8b", "gzip-compressed", "name it {name}.gz so it is decompressed"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "name it {name}.zst so it is decompressed"),
    (b"\xfd7zXZ\x00", "xz-compressed", "name it {name}.xz so it is decompressed"),
    (b"PK\x03\x04", "a zip archive", "unzip it and give the files inside as input"),
    (b"\xff\xfe", "UTF-16 text", "save it as UTF-8"),
    (b"\xfe\xff", "UTF-16 text", "save it as UTF-8"),
)
#: Bytes no text file holds: NUL and the C0 controls but BEL, BS, tab, line breaks, VT, FF and ESC
#: (the bytes file(1) counts as text), and DEL.
_NOT_TEXT = bytes([*range(0x00, 0x07), *range(0x0E, 0x1B), *range(0x1C, 0x20), 0x7F])


def binary_lines(head: bytes) -> tuple[int, int] | None:
    """(lines holding bytes no text has, non-blank lines) of a file's first bytes when they are
    binary data: more than half of its bytes are such bytes (a file mostly NUL), or more than 1 in
    100 are and more than half of its lines hold one (a blob, UTF-16 without its mark); None for
    text, also text with a few bad lines, each of which is then an error row of its own."""
    odd = len(head) - len(head.translate(None, _NOT_TEXT))
    if not odd:
        return None
    lines = [line for line in head.split(b"\n") if line.strip()]
    bad = sum(1 for line in lines if len(line.translate(None, _NOT_TEXT)) < len(line))
    if 2 * odd > len(head) or (100 * odd > len(head) and 2 * bad > len(lines)):
        return bad, len(lines)
    return None


def no_good_rows(f: str, n: int, first: tuple[int, str]) -> InputError:
    """The stop for a file none of whose ``n`` rows could be read (``first``: the first bad line and why)."""
    line, reason = first
    if reason.startswith("invalid_text") and "not valid UTF-8" in reason:
        return InputError(f"cannot read input file {f}: none of its {n} rows is valid UTF-8 (line {line}); "
                          "it is probably Latin-1/Windows-1252: save it as UTF-8")
    return InputError(f"cannot read input file {f}: none of its {n} rows is readable ({reason}): check input_format, "
                      "the delimiter and the encoding (UTF-8)")


# ---------------------------------------------------------------------------------------------
# Lines and records


def physical_lines(fh: IO[bytes]) -> Iterator[tuple[int, str]]:
    """(line number, text) for every physical line; bytes that are not UTF-8 become lone
    surrogates (found again per value, so a bad byte is blamed on its column)."""
    for n, raw in enumerate(fh, start=1):
        if n == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        yield n, raw.decode("utf-8", "surrogateescape")


def json_problem(exc: ValueError | RecursionError, text: str) -> str:
    """Why a line is not JSON, for its error row: the parser's words and the column, or the raw
    control byte (a NUL...) that a JSON string may only hold escaped."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if not isinstance(exc, json.JSONDecodeError):
        return str(exc)
    if exc.msg.startswith("Invalid control character") and exc.pos < len(text):
        return f"a raw control byte 0x{ord(text[exc.pos]):02X} at column {exc.colno}: JSON strings must escape it"
    return f"{exc.msg}: column {exc.colno}"


def bad_utf8(value: str) -> str | None:
    """Where ``value`` (read by :func:`physical_lines`) holds a byte that is not UTF-8, for its error
    row; None where it holds none."""
    m = SURROGATE.search(value)
    if m is None:
        return None
    return f"byte 0x{ord(m.group()) - 0xDC00:02X} at character {m.start() + 1}"
