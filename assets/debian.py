"""The demo job: put Debian package descriptions into their archive section.

The input comes from this machine's own apt records (``apt-cache dumpavail``, or
``/var/lib/dpkg/status`` when apt has no lists), so the demo needs no download. The archive
``section`` is the gold label. Size: ``SPARKBATCH_DEMO_ROWS`` (2000) rows in
``SPARKBATCH_DEMO_SHARDS`` (8) shards, under ``SPARKBATCH_HOME`` (``.sparkbatch/debian_sections``).
"""


import os
import subprocess
from pathlib import Path

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from sparkbatch_dagster import EstimateSpec, JobSpec, OutputSpec, SamplingSpec, build_batch_assets
from sparkbatch_dagster.errors import InputError

ROWS = int(os.environ.get("SPARKBATCH_DEMO_ROWS", "2000"))
SHARDS = int(os.environ.get("SPARKBATCH_DEMO_SHARDS", "8"))
HOME = Path(os.environ.get("SPARKBATCH_HOME", ".sparkbatch/debian_sections")).resolve()
INPUT = HOME / "input" / f"packages-{ROWS}.parquet"

# Debian's archive sections (https://packages.debian.org/stable/): the allowed labels.
SECTIONS = [
    "admin", "cli-mono", "comm", "database", "debug", "devel", "doc", "editors", "education",
    "electronics", "embedded", "fonts", "games", "gnome", "gnu-r", "gnustep", "golang", "graphics",
    "hamradio", "haskell", "httpd", "interpreters", "introspection", "java", "javascript", "kde",
    "kernel", "libdevel", "libs", "lisp", "localization", "mail", "math", "metapackages", "misc", "net",
    "news", "ocaml", "oldlibs", "otherosfs", "perl", "php", "python", "ruby", "rust", "science",
    "shells", "sound", "tasks", "tex", "text", "utils", "vcs", "video", "web", "x11", "xfce", "zope",
]


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

    from sparkbatch_dagster.store import atomic_write_parquet

    if not INPUT.exists():
        rows = sample(read_apt_records(), ROWS)
        atomic_write_parquet(INPUT, pa.Table.from_pylist(rows))
    import pyarrow.parquet as pq

    n = pq.read_metadata(INPUT).num_rows
    return MaterializeResult(metadata={"rows": n, "path": MetadataValue.path(str(INPUT))})


spec = JobSpec(
    name="debian_sections",
    input=str(INPUT),
    id_column="package",
    text_columns=["package", "description"],
    system_prompt="You sort Debian packages into archive sections. Allowed sections: " + ", ".join(SECTIONS) + ".",
    user_template="Package: {{ package }}\nDescription: {{ description }}\n\nWhich section is this package in?",
    output=OutputSpec(kind="label", labels=SECTIONS),
    sampling=SamplingSpec(max_tokens=8, temperature=0.0),
    shard_count=SHARDS,
    gold_column="section",
    home=str(HOME),
    # `sparkbatch estimate` compares the default model with Gemma 3 270M (both embedded).
    estimate=EstimateSpec(models=["gemma-3-270m"], accuracy_bar=0.2),
)

debian_job = build_batch_assets(spec=spec, upstream=[debian_packages])
