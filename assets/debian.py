"""The demo job's input: Debian package descriptions, with their archive section.

The job itself (prompt, labels, shards, gold column, estimate settings) is declared in
``assets/defs/debian_sections/defs.yaml``; this module is its input builder. The input comes
from this machine's own apt records (``apt-cache dumpavail``, or ``/var/lib/dpkg/status`` when
apt has no lists), so the demo needs no download. The archive ``section`` is the gold label.
Size: ``SPARKBATCH_DEMO_ROWS`` (2000) rows under ``SPARKBATCH_HOME``
(``.sparkbatch/debian_sections``); ``SPARKBATCH_DEMO_SHARDS`` (8) shards (read by the defs.yaml).
"""


import os
import subprocess
from pathlib import Path

import yaml
from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from sparkbatch_dagster.errors import InputError

ROWS = int(os.environ.get("SPARKBATCH_DEMO_ROWS", "2000"))
HOME = Path(os.environ.get("SPARKBATCH_HOME", ".sparkbatch/debian_sections")).resolve()
INPUT = HOME / "input" / f"packages-{ROWS}.parquet"

#: The job's declaration; its labels are Debian's archive sections (https://packages.debian.org/stable/).
JOB_YAML = Path(__file__).parent / "defs" / "debian_sections" / "defs.yaml"
SECTIONS: list[str] = yaml.safe_load(JOB_YAML.read_text())["attributes"]["output"]["labels"]


def apt_text() -> str:
    """This machine's package records: ``apt-cache dumpavail``, or dpkg's status file when apt has no lists."""
    try:
        text = subprocess.run(["apt-cache", "dumpavail"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        text = ""
    if "Package:" not in text:
        status = Path("/var/lib/dpkg/status")
        if not status.exists():
            raise InputError("no apt records here (apt-cache dumpavail and /var/lib/dpkg/status both empty)")
        text = status.read_text(errors="replace")
    return text


def parse_stanzas(text: str) -> list[dict[str, str]]:
    """apt/dpkg records as dicts (continuation lines joined); a field's first line is also kept
    apart as ``<field>@first`` (a Description's one-line summary)."""
    records = []
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        last = ""
        for line in stanza.splitlines():
            if line.startswith((" ", "\t")) and last:
                fields[last] += "\n" + line.strip()
            elif ":" in line:
                last, _, value = line.partition(":")
                fields[last] = fields[last + "@first"] = value.strip()
        if fields:
            records.append(fields)
    return records


def read_apt_records() -> list[dict[str, str]]:
    """Package, section and description of every package apt (or dpkg) knows."""
    return [{"package": f["Package"], "section": f["Section"].split("/")[-1],
             "description": f["Description"].replace("\n.", "\n")[:1000]}
            for f in parse_stanzas(apt_text()) if "Package" in f and "Description" in f and "Section" in f]


def sample(records: list[dict[str, str]], rows: int) -> list[dict[str, str]]:
    """Every n-th unique package, so the sample spans the alphabet and the sections."""
    unique = list({r["package"]: r for r in records}.values())
    step = max(1, len(unique) // rows)
    return unique[::step][:rows]


@asset(key=["debian_sections", "debian_packages"], group_name="debian_sections", kinds={"parquet"},
       description="Debian package records from this machine's apt lists, with the archive section.")
def debian_packages(context: AssetExecutionContext) -> MaterializeResult:
    import pyarrow as pa

    from sparkbatch_dagster.home import atomic_write_parquet

    if not INPUT.exists():
        rows = sample(read_apt_records(), ROWS)
        atomic_write_parquet(INPUT, pa.Table.from_pylist(rows))
    import pyarrow.parquet as pq

    n = pq.read_metadata(INPUT).num_rows
    return MaterializeResult(metadata={"rows": n, "path": MetadataValue.path(str(INPUT))})
