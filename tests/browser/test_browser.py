"""The Dagster UI in a real browser: headless Chromium (Debian's ``chromium``, driven by Playwright
for Python, no browser download) against ``dagster dev`` on loopback, with the real CPU engine.

One small job (40 rows with a gold label, 4 shards), declared in a ``defs.yaml``
(``BatchInferenceComponent``) when the package has it, else in Python. What a user does, by
clicks: the lineage shows the seven assets; materialize ``input_shards``; on ``labeled_outputs``,
Materialize... -> Missing -> Launch backfill; the backfill's single run starts one engine and each
partition turns green as its shard commits; a second backfill of the same partitions generates
nothing and is over long before the first; the assets point back at their defs.yaml. A scattered
backfill (two ranges, two runs) costs one engine start: that test's job (``scatter``, the same rows)
runs on the fake engine, whose starts the run logs as the real one's, so the tier starts one real
engine in all. ``scatter``'s ``analytics`` shows its calibration chart in place.

Every step leaves a screenshot under this test's tmp folder (its path is printed);
``SPARKBATCH_SAVE_SCREENSHOTS=1`` also copies four of them to ``docs/ui/`` (the README's pictures).
Without chromium the test is skipped, except under ``make`` (``make test`` installs it first).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from testkit import EAGER, LABELS, label_then_metrics, make_rows, write_parquet

REPO = Path(__file__).resolve().parents[2]
ROWS, SHARDS = 40, 4
ASSETS = ("input_shards", "labeled_outputs", "run_metrics", "analytics", "estimate", "review_queue", "human_labels")
#: Test-sized engine. One sequence at a time, so the shards commit one after the other, each
#: a visible moment apart (with a full batch all four would finish in the same step).
ENGINE: dict[str, Any] = {"kv_cache_memory_gb": 1.0, "max_num_seqs": 1, "max_model_len": 1024,
                          "engine_kwargs": EAGER}
#: Each partition of the single-run backfill materializes the moment its shard commits (not all
#: at the end of the run): their event timestamps are strictly increasing, this far apart at least.
PER_PARTITION_EVENTS = True
MIN_GAP_S = 0.15
#: Declared in a defs.yaml when the component exists; else the same job in Python.
YAML = importlib.util.find_spec("sparkbatch_dagster.definitions.component") is not None
#: Under make (``make test`` installs chromium first) a missing browser is a failure, not a skip.
REQUIRED = "MAKELEVEL" in os.environ or os.environ.get("SPARKBATCH_REQUIRE_BROWSER") == "1"
SAVE = os.environ.get("SPARKBATCH_SAVE_SCREENSHOTS") == "1"
TERMINAL = {"SUCCESS", "FAILURE", "CANCELED"}
# Past dagster dev's own shutdown (60 s for its webserver, then 60 s for its daemon, before it kills
# them) and its code server's: only a wait past that is a hang.
DEV_SHUTDOWN_S = 240
#: The longest a page element may take to show (a wait for it, polled): renders that take 0.2 s here
#: took over 5 s with a second suite on the box; past two minutes the UI is broken, not slow.
UI_WAIT_MS = 120_000
#: A backfill's run, engine start included: 1-2 minutes here alone; only past this is it stuck.
BACKFILL_WAIT_S = 1200
#: A PNG's width: the first field of its IHDR chunk, bytes 16-20.
PNG_WIDTH = struct.Struct(">I")


def job_fields(src: Path, home: Path) -> dict[str, Any]:
    """The job, as JobSpec fields (also the defs.yaml attributes)."""
    return {
        "name": "things", "input": str(src), "id_column": "id", "text_columns": ["text"],
        "system_prompt": "Answer with one word: fruit, vehicle or animal.",
        "user_template": "What kind of thing is this? {{ text }}",
        "output": {"kind": "label", "labels": LABELS}, "sampling": {"max_tokens": 4},
        "shard_count": SHARDS, "gold_column": "gold", "home": str(home),
        "checkpoint_rows": 4, "checkpoint_seconds": 0.5,
    }


#: The scattered backfill's job: the same rows on the fake engine, under the same `gpu` pool.
SCATTER_PY = """
import json
from dagster import Definitions
from sparkbatch_dagster import JobSpec, build_batch_assets
from sparkbatch_dagster.testing import FakeVLLMResource



def scatter_defs() -> Definitions:  # a function: Dagster allows one Definitions at module scope
    # In the job's group: with one group the UI's global lineage draws every asset, not groups.
    scatter = build_batch_assets(spec=JobSpec(**json.loads({scatter!r})), resource_key="fake", group_name="things")
    return Definitions(assets=scatter.assets, resources={{"fake": FakeVLLMResource(delay_s=0.05)}})
"""
DEFS_PY = SCATTER_PY + """
from sparkbatch_dagster import VLLMResource

job = build_batch_assets(spec=JobSpec(**json.loads({fields!r})))
defs = Definitions.merge(scatter_defs(),
                         Definitions(assets=job.assets, resources={{"vllm": VLLMResource(**json.loads({engine!r}))}}))
"""
DG_PYPROJECT = """
[tool.dg]
directory_type = "project"

[tool.dg.project]
root_module = "uiproj"
defs_module = "uiproj.defs"
"""
DEFS_FOLDER_PY = SCATTER_PY + """
from pathlib import Path
from dagster import load_from_defs_folder

defs = Definitions.merge(load_from_defs_folder(path_within_project=Path(__file__).resolve().parent), scatter_defs())
"""
DAGSTER_YAML = """
telemetry:
  enabled: false
run_coordinator:
  module: dagster._core.run_coordinator
  class: QueuedRunCoordinator
  config:
    dequeue_interval_seconds: 1
"""


def scatter_fields(root: Path) -> dict[str, Any]:
    """The scattered backfill's job: the same rows, a home of its own."""
    return {**job_fields(root / "in" / "rows.parquet", root / "scatter-home"), "name": "scatter"}


def write_job(root: Path) -> tuple[Path, Path | None]:
    """The input, and the definitions file (plus the defs.yaml when declared in YAML)."""
    src = write_parquet(root / "in" / "rows.parquet", make_rows(ROWS))
    fields = job_fields(src, root / "home")
    scatter = json.dumps(scatter_fields(root))
    if not YAML:
        defs = root / "defs.py"
        defs.write_text(DEFS_PY.format(fields=json.dumps(fields), engine=json.dumps(ENGINE), scatter=scatter))
        return defs, None
    project = root / "project"
    folder = project / "uiproj" / "defs" / "things"
    folder.mkdir(parents=True)
    for pkg in (project / "uiproj", project / "uiproj" / "defs"):
        (pkg / "__init__.py").write_text("")
    (project / "pyproject.toml").write_text(DG_PYPROJECT)
    defs_yaml = folder / "defs.yaml"
    defs_yaml.write_text(yaml.safe_dump(
        {"type": "sparkbatch_dagster.BatchInferenceComponent", "attributes": {**fields, "engine": ENGINE}},
        sort_keys=False))
    defs = project / "definitions.py"
    defs.write_text(DEFS_FOLDER_PY.format(scatter=scatter))
    return defs, defs_yaml


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _default_signals() -> None:
    # A shell's background job (CI runners, agents) may start us with SIGINT/SIGTERM ignored, and
    # the children would inherit that: `dagster dev` could then not be stopped but by SIGKILL.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def _in_session(sid: int) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.Error, OSError):
            pass
    return found


def _command(p: psutil.Process) -> str | None:
    """Its command line; None once it cannot be read (gone, or killed: a zombie has none)."""
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return None


def _describe(p: psutil.Process) -> str:
    """A process as `pid: command`, read before it is killed."""
    return f"{p.pid}: {(_command(p) or '(unreadable)')[:160]}"


def _engines(sid: int) -> list[str]:
    """vLLM processes (an EngineCore, a `vllm` command) among this dagster dev's processes."""
    commands = ((p, _command(p) or "") for p in _in_session(sid))
    return [f"{p.pid}: {cmd[:120]}" for p, cmd in commands if "EngineCore" in cmd or "vllm" in cmd.lower()]


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    shots: Path
    defs_yaml: Path | None
    log: Path
    home: Path
    root: Path
    timings: dict[str, float] = field(default_factory=dict)

    def gql(self, query: str, **variables: Any) -> dict[str, Any]:
        req = urllib.request.Request(f"{self.url}/graphql", data=json.dumps({"query": query, "variables": variables})
                                     .encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=UI_WAIT_MS / 1000) as r:
            body = json.load(r)
        assert not body.get("errors"), body["errors"]
        return body["data"]

    def log_tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`dagster dev` (webserver + the daemon that runs backfills) on a free loopback port, on a
    fresh DAGSTER_HOME; stopped with its whole process group, and nothing of it left behind."""
    if os.environ.get("SPARKBATCH_SKIP_REAL") == "1":
        pytest.skip("SPARKBATCH_SKIP_REAL=1")
    root = tmp_path_factory.mktemp("browser")
    defs, defs_yaml = write_job(root)
    home = root / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(DAGSTER_YAML)
    # As the instance `make ui` sets up: one engine-starting run at a time.
    subprocess.run([str(Path(sys.executable).parent / "dagster"), "instance", "concurrency", "set", "gpu", "1"],
                   env={**os.environ, "DAGSTER_HOME": str(home)}, check=True, capture_output=True)
    shots = root / "screenshots"
    shots.mkdir()
    port = _port()
    log = root / "dagster-dev.log"
    env = {**os.environ, "DAGSTER_HOME": str(home),
           "PYTHONPATH": os.pathsep.join([str(REPO), str(defs.parent)])}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster"), "dev", "-f", str(defs), "-h", "127.0.0.1", "-p", str(port)],
            env=env, cwd=defs.parent, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=_default_signals,
        )
    srv = Server(f"http://127.0.0.1:{port}", proc, shots, defs_yaml, log, root / "home", root)
    print(f"\nbrowser test: screenshots in {shots}, dagster dev log {log}")
    try:
        _wait_for_definitions(srv, time.monotonic() + 180)
        yield srv
    finally:
        t_stop = time.monotonic()
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(DEV_SHUTDOWN_S)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        deadline = time.monotonic() + 60  # children of what dagster dev killed stop on our SIGTERM
        while _in_session(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        srv.timings["shutdown_s"] = round(time.monotonic() - t_stop, 1)
        left = [_describe(p) for p in _in_session(proc.pid)]
        for p in _in_session(proc.pid):
            p.kill()
        print(f"browser test: {json.dumps(srv.timings)}")
        assert not left, f"dagster dev left processes behind after SIGTERM: {left}\n{srv.log_tail()}"


def _wait_for_definitions(srv: Server, deadline: float) -> None:
    """Until the webserver answers and its code location has loaded the assets."""
    t0 = time.monotonic()
    while time.monotonic() < deadline:
        assert srv.proc.poll() is None, f"dagster dev exited:\n{srv.log_tail()}"
        try:
            nodes = srv.gql("{ assetNodes { assetKey { path } } }")["assetNodes"]
            if nodes:
                srv.timings["server_up_s"] = round(time.monotonic() - t0, 1)
                return
        except (OSError, AssertionError):
            pass
        time.sleep(0.5)
    pytest.fail(f"dagster dev did not load the definitions in time:\n{srv.log_tail()}")


@pytest.fixture(scope="module")
def page() -> Iterator[Any]:
    """Headless Debian chromium under Playwright (checked before dagster dev starts)."""
    chromium = shutil.which("chromium")
    why = None
    if chromium is None:
        why = "chromium is not installed (Debian/Ubuntu: apt-get install chromium; `make browser` does it)"
    elif importlib.util.find_spec("playwright") is None:
        why = "playwright is not installed (pip install -e '.[dev]')"
    if why:
        if REQUIRED:
            pytest.fail(f"{why}: under make this test must run")
        pytest.skip(why)
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True)
        context = browser.new_context(viewport={"width": 1600, "height": 1000})
        # The "Join the Dagster community" dialog that `dagster dev` shows on a first visit.
        context.add_init_script("window.localStorage.setItem('communityNux', '\"1\"')")
        pg = context.new_page()
        # Waits for a condition, not sleeps: how long a render may take on a busy 2-core box (a second
        # suite beside this one at load average 70 took over 5 s, expect's default).
        pg.set_default_timeout(UI_WAIT_MS)
        expect.set_options(timeout=UI_WAIT_MS)
        try:
            yield pg
        finally:
            browser.close()


def _shot(server: Server, pg: Any, name: str) -> None:
    pg.screenshot(path=str(server.shots / name))


def _open(server: Server, pg: Any, path: str) -> None:
    pg.goto(server.url + path)
    pg.wait_for_load_state("networkidle")


def _materializations(server: Server, asset: str, job: str = "things") -> list[dict[str, Any]]:
    data = server.gql("""query($k: AssetKeyInput!) { assetOrError(assetKey: $k) { ... on Asset {
        assetMaterializations(limit: 1000) { partition runId timestamp metadataEntries { label
          ... on IntMetadataEntry { intValue } ... on FloatMetadataEntry { floatValue }
          ... on BoolMetadataEntry { boolValue } } } } } }""", k={"path": [job, asset]})
    out = []
    for m in data["assetOrError"]["assetMaterializations"]:
        md = {e["label"]: e.get("intValue", e.get("floatValue", e.get("boolValue"))) for e in m["metadataEntries"]}
        out.append({"partition": m["partition"], "run": m["runId"], "t": int(m["timestamp"]) / 1000, "md": md})
    return sorted(out, key=lambda m: m["t"])


def _backfill_run(server: Server, backfill: str) -> dict[str, Any] | None:
    """The backfill's run once it has finished (a single-run backfill has one)."""
    data = server.gql("""query($id: String!) { partitionBackfillOrError(backfillId: $id) { __typename
        ... on PartitionBackfill { status runs(limit: 10) { runId status startTime endTime } } } }""", id=backfill)
    runs = data["partitionBackfillOrError"]["runs"]
    assert len(runs) <= 1, f"a single-run backfill launched {len(runs)} runs: {runs}"
    return runs[0] if runs and runs[0]["status"] in TERMINAL else None


def _run_messages(server: Server, run_id: str) -> str:
    data = server.gql("""query($id: ID!) { logsForRun(runId: $id) { ... on EventConnection {
        events { __typename ... on MessageEvent { message } } } } }""", id=run_id)
    return "\n".join(e.get("message", "") for e in data["logsForRun"]["events"])[-6000:]


def _launch_backfill(server: Server, pg: Any, selection: str, shot: str, keys: list[str] | None = None,
                     job: str = "things") -> str:
    """On labeled_outputs: Materialize... -> `selection` (Missing, All) -> Launch backfill; its id.
    ``keys``: the partitions the dialog must list (default: all of them)."""
    from playwright.sync_api import expect

    _open(server, pg, f"/assets/{job}/labeled_outputs")
    pg.get_by_role("button", name=re.compile(r"Materialize…$")).click()
    dialog = pg.get_by_role("dialog")
    expect(dialog.get_by_text(f"Launch runs to materialize {job} / labeled_outputs")).to_be_visible()
    dialog.get_by_role("button", name=selection, exact=True).click()
    keys = keys or [f"shard-{i:05d}" for i in range(SHARDS)]
    expect(dialog.get_by_text(f"{len(keys)} partitions", exact=True)).to_be_visible()
    for key in keys:
        expect(dialog.get_by_text(key).first).to_be_visible()
    expect(dialog.get_by_text("Backfills all partitions in a single run.")).to_be_visible()
    _shot(server, pg, shot)
    dialog.get_by_role("button", name="Launch backfill").click()
    toast = pg.get_by_text(re.compile(r"^Created backfill \w+$"))
    expect(toast).to_be_visible()
    return toast.inner_text().split()[-1]


@dataclass
class Watched:
    """What was seen while a backfill ran."""

    run: dict[str, Any]
    #: (seconds since launch, partitions materialized, partitions materializing, run finished)
    statuses: list[tuple[float, int, int, bool]]
    engines: set[str]
    #: Screenshots of the Events tab taken while partitions came in, by partitions materialized.
    shots: dict[int, str]


def _partition_statuses(server: Server, job: str = "things") -> tuple[int, int]:
    data = server.gql("""query($k: [AssetKeyInput!]) { assetNodes(assetKeys: $k) { assetPartitionStatuses {
        ... on DefaultPartitionStatuses { materializedPartitions materializingPartitions } } } }""",
                      k=[{"path": [job, "labeled_outputs"]}])
    st = data["assetNodes"][0]["assetPartitionStatuses"]
    return len(st["materializedPartitions"]), len(st["materializingPartitions"])


def _wait_for_backfill(server: Server, pg: Any, backfill: str, prefix: str, timeout: float) -> Watched:
    """Watch the asset's Events tab (a screenshot whenever Dagster counts one more partition
    materialized) and the engine processes until the backfill's run has finished; then the
    Partitions tab must show every partition materialized."""
    from playwright.sync_api import expect

    pg.get_by_role("tab", name="Events").click()
    # The list on the left: one row per materialization, named by its partition (the selected
    # one's name is also a link in the panel on the right).
    names = pg.get_by_text(re.compile(r"^shard-\d{5}$"))
    links = pg.get_by_role("link", name=re.compile(r"^shard-\d{5}$"))
    t0 = time.monotonic()
    seen = Watched(run={}, statuses=[], engines=set(), shots={})
    run = None
    while time.monotonic() - t0 < timeout:
        seen.engines.update(_engines(server.proc.pid))
        done, busy = _partition_statuses(server)
        run = run or _backfill_run(server, backfill)
        state = (round(time.monotonic() - t0, 1), done, busy, run is not None)
        if not seen.statuses or seen.statuses[-1][1:] != state[1:]:
            seen.statuses.append(state)
        rows = names.count() - links.count()
        if run is None and rows > max(seen.shots, default=0):
            seen.shots[rows] = f"{prefix}-events-{rows}-of-{SHARDS}.png"
            _shot(server, pg, seen.shots[rows])
        if run is not None and done == SHARDS and not busy:
            break
        assert server.proc.poll() is None, f"dagster dev exited:\n{server.log_tail()}"
        time.sleep(0.25)
    assert run is not None, f"backfill {backfill} did not finish in {timeout:.0f}s:\n{server.log_tail()}"
    assert run["status"] == "SUCCESS", f"backfill run {run['runId']} {run['status']}:\n" + _run_messages(
        server, run["runId"])
    for i in range(SHARDS):
        expect(pg.get_by_text(f"shard-{i:05d}", exact=True).first).to_be_visible()
    _shot(server, pg, f"{prefix}-events.png")
    pg.get_by_role("tab", name="Partitions").click()
    expect(pg.get_by_text(re.compile(r"^Materialized \(\d+\)$"))).to_have_text(f"Materialized ({SHARDS})")
    expect(pg.get_by_text(re.compile(r"^Materializing \(\d+\)$"))).to_have_text("Materializing (0)")
    print(f"{prefix}: (s, materialized, materializing, run over): {seen.statuses}")
    seen.run = run
    return seen


def test_the_lineage_shows_the_seven_assets_of_the_job(page: Any, server: Server) -> None:
    """(a) the asset graph; (e) with a defs.yaml, every asset points back at it."""
    from playwright.sync_api import expect

    nodes = server.gql("{ assetNodes { assetKey { path } metadataEntries { label __typename "
                       "... on CodeReferencesMetadataEntry { codeReferences { __typename "
                       "... on LocalFileCodeReference { filePath } } } ... on TextMetadataEntry { text } } } }")
    things = [n for n in nodes["assetNodes"] if n["assetKey"]["path"][0] == "things"]
    keys = sorted("/".join(n["assetKey"]["path"]) for n in things)
    assert keys == sorted(f"things/{a}" for a in ASSETS)

    _open(server, page, "/asset-groups")
    graph = page.locator("svg")
    for name in ASSETS:
        expect(graph.get_by_text(name, exact=True).first).to_be_visible()
    _shot(server, page, "a1-lineage.png")

    if server.defs_yaml is None:
        print("declared in Python: sparkbatch_dagster.definitions.component is not there yet")
        return
    for node in things:
        md = {e["label"]: e for e in node["metadataEntries"]}
        refs = md["dagster/code_references"]["codeReferences"]
        assert [r.get("filePath") for r in refs] == [str(server.defs_yaml)], node["assetKey"]
        assert md["dagster/component_origin"]["text"] == "BatchInferenceComponent"
    _open(server, page, "/assets/things/labeled_outputs")
    source = page.get_by_role("link", name=re.compile(r"^Open defs\.yaml .*in editor$"))
    expect(source).to_be_visible()
    assert str(source.get_attribute("href")).endswith(f"{server.defs_yaml}:1")
    expect(page.get_by_text("BatchInferenceComponent", exact=True)).to_be_visible()
    _shot(server, page, "e1-from-defs-yaml.png")


@pytest.mark.heavy  # a real engine beside dagster dev and chromium: with a second suite's, the box ran out of memory
def test_a_backfill_from_the_materialize_dialog(page: Any, server: Server) -> None:
    """(b) materialize input_shards, then backfill the missing partitions of labeled_outputs by
    clicks; (c) one run, each partition green as its shard commits; (d) the same backfill again
    generates nothing, much faster; no engine is left running."""
    from playwright.sync_api import expect

    t0 = time.monotonic()
    # (b) input_shards: the Materialize button (no partitions: one run at once).
    _open(server, page, "/assets/things/input_shards")
    page.get_by_role("button", name=re.compile(r"Materialize$")).click()
    expect(page.get_by_text(re.compile(r"^Launched run \w+$"))).to_be_visible()
    deadline = time.monotonic() + 120
    while not _materializations(server, "input_shards"):
        assert time.monotonic() < deadline, f"input_shards did not materialize:\n{server.log_tail()}"
        time.sleep(0.5)
    _open(server, page, "/assets/things/input_shards")
    expect(page.get_by_text("Never materialized")).to_have_count(0)
    _shot(server, page, "b1-input-shards.png")
    server.timings["input_shards_s"] = round(time.monotonic() - t0, 1)

    keys = server.gql("""query($k: AssetKeyInput!) { assetNodeOrError(assetKey: $k) {
        ... on AssetNode { partitionKeys } } }""", k={"path": ["things", "labeled_outputs"]}
                      )["assetNodeOrError"]["partitionKeys"]
    assert sorted(keys) == [f"shard-{i:05d}" for i in range(SHARDS)]

    # (b) labeled_outputs: Materialize... -> Missing -> Launch backfill.
    t1 = time.monotonic()
    first = _launch_backfill(server, page, "Missing", "b2-backfill-dialog.png")
    # (c) its one run starts one engine; each partition comes in as its shard commits.
    one = _wait_for_backfill(server, page, first, "c", BACKFILL_WAIT_S)
    _shot(server, page, "c3-partitions-green.png")
    server.timings["first_backfill_s"] = round(time.monotonic() - t1, 1)
    assert one.engines, "the first backfill ran without a vLLM engine process: is this the real engine?"
    mats = [m for m in _materializations(server, "labeled_outputs") if m["run"] == one.run["runId"]]
    assert sorted(m["partition"] for m in mats) == sorted(keys), "every partition once, from the one run"
    assert all(m["md"]["generated_requests"] > 0 for m in mats), [m["md"] for m in mats]
    if PER_PARTITION_EVENTS:
        # Shards commit in key order, one by one (max_num_seqs=1): each partition's event was
        # recorded as its shard committed, not all together when the run ended...
        by_key = sorted(mats, key=lambda m: m["partition"])
        gaps = [round(b["t"] - a["t"], 3) for a, b in zip(by_key, by_key[1:])]
        assert all(g >= MIN_GAP_S for g in gaps), (
            f"partitions should materialize one by one as their shards commit (each >= {MIN_GAP_S}s after the "
            f"previous one, in key order); gaps between {[m['partition'] for m in by_key]}: {gaps}")
        # ...so Dagster counted some, not all, partitions materialized while the run was still going.
        partial = [s for s in one.statuses if not s[3] and 0 < s[1] < SHARDS]
        assert partial, f"no partition turned green before the run ended: {one.statuses}"
        assert sum(m["md"]["rows"] for m in mats) == ROWS, "each partition carries its own rows"
    _open(server, page, "/assets/things/labeled_outputs")
    _shot(server, page, "c4-labeled-outputs.png")
    assert not _engines(server.proc.pid), "the engine outlived its run"

    # (d) the same four partitions again: all done, so nothing to generate and no engine start.
    t2 = time.monotonic()
    second = _launch_backfill(server, page, "All", "d1-second-backfill-dialog.png")
    assert second != first
    two = _wait_for_backfill(server, page, second, "d", BACKFILL_WAIT_S)
    server.timings["second_backfill_s"] = round(time.monotonic() - t2, 1)
    again = [m for m in _materializations(server, "labeled_outputs") if m["run"] == two.run["runId"]]
    assert sorted(m["partition"] for m in again) == sorted(keys)
    for m in again:
        assert m["md"]["generated_requests"] == 0, f"{m['partition']} generated again: {m['md']}"
        assert m["md"].get("engine_start_s", 0) == 0, m["md"]
        assert m["md"].get("computed_in_this_run", False) is False, m["md"]
    assert not two.engines, f"a backfill with nothing to generate started an engine: {sorted(two.engines)}"
    wall1, wall2 = (r["endTime"] - r["startTime"] for r in (one.run, two.run))
    server.timings.update(first_run_s=round(wall1, 1), second_run_s=round(wall2, 1))
    assert wall2 < wall1 / 2, f"the no-op backfill's run took {wall2:.1f}s, the first {wall1:.1f}s"
    _open(server, page, "/assets/things/labeled_outputs")
    expect(page.get_by_text("generated_requests", exact=True)).to_be_visible()
    _shot(server, page, "d2-labeled-outputs-again.png")
    _open(server, page, "/asset-groups")
    expect(page.locator("svg").get_by_text("labeled_outputs", exact=True).first).to_be_visible()
    page.wait_for_timeout(1000)  # the nodes' live data (partitions filled, checks) fills in
    _shot(server, page, "d3-lineage.png")
    assert not _engines(server.proc.pid), "the engine outlived its run"

    if SAVE:
        # The README's pictures: the dialog, partitions coming in during the run (the first
        # screenshot with some but not all of them; the finished list if none was caught), the rerun.
        partial_shots = [f for n, f in sorted(one.shots.items()) if 0 < n < SHARDS]
        picks = {"b2-backfill-dialog.png": "backfill-dialog.png",
                 (partial_shots or ["c-events.png"])[0]: "partitions-coming-in.png",
                 "d2-labeled-outputs-again.png": "rerun-generates-nothing.png"}
        docs = REPO / "docs" / "ui"
        docs.mkdir(parents=True, exist_ok=True)
        for src, dst in picks.items():
            shutil.copyfile(server.shots / src, docs / dst)


def _backfill_runs(server: Server, backfill: str) -> list[dict[str, Any]]:
    data = server.gql("""query($id: String!) { partitionBackfillOrError(backfillId: $id) { __typename
        ... on PartitionBackfill { status runs(limit: 10) { runId status startTime endTime } } } }""", id=backfill)
    return data["partitionBackfillOrError"]["runs"]


def test_a_scattered_backfill_costs_one_engine_start(page: Any, server: Server) -> None:
    """(f) every shard of the ``scatter`` job labeled, then shards 0 and 2 lost (their labeled
    files, stats, every stored answer, and their materializations wiped), so Materialize... ->
    Missing is two ranges, two runs to Dagster; the first labels both on one engine, the second
    finds its shard done and starts none. On the fake engine: what is checked is Dagster's runs
    and the `gpu` pool, and the engine starts each run logs."""
    from dagster import AssetKey, AssetMaterialization, DagsterInstance, materialize
    from playwright.sync_api import expect

    from sparkbatch_dagster import JobSpec, build_batch_assets
    from sparkbatch_dagster.testing import FakeVLLMResource

    inst = DagsterInstance.from_config(str(server.root / "dagster_home"))
    job = build_batch_assets(spec=JobSpec(**scatter_fields(server.root)), resource_key="fake", group_name="things")
    res = {"fake": FakeVLLMResource()}
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    keys = sorted(inst.get_dynamic_partitions(job.partitions_def.name))
    tags = {"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]}
    assert materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources=res, instance=inst,
                       tags=tags).success
    home = server.root / "scatter-home"
    [version] = [p for p in (home / "out").iterdir() if p.is_dir()]
    lost = ["shard-00000", "shard-00002"]
    for key in lost:
        (version / "labeled" / f"{key}.parquet").unlink()
        (version / "stats" / f"{key}.json").unlink()
    shutil.rmtree(home / "results")  # no stored answer either: the engine must run
    # Dagster must call them missing too, as after a partial failure: the asset's history wiped
    # (SQLite storage cannot wipe single partitions) and the two kept partitions reported again.
    key = AssetKey(["scatter", "labeled_outputs"])
    inst.wipe_assets([key])
    for kept in ("shard-00001", "shard-00003"):
        inst.report_runless_asset_event(AssetMaterialization(key, partition=kept))
    t0 = time.monotonic()
    backfill = _launch_backfill(server, page, "Missing", "f1-scattered-backfill-dialog.png", keys=lost, job="scatter")
    runs: list[dict[str, Any]] = []
    while time.monotonic() - t0 < 360:
        runs = _backfill_runs(server, backfill)
        if len(runs) == 2 and all(r["status"] in TERMINAL for r in runs) and \
                _partition_statuses(server, "scatter") == (SHARDS, 0):
            break
        assert server.proc.poll() is None, f"dagster dev exited:\n{server.log_tail()}"
        time.sleep(0.5)
    server.timings["scattered_backfill_s"] = round(time.monotonic() - t0, 1)
    assert len(runs) == 2, f"Dagster made {len(runs)} runs of the two ranges: {runs}"
    assert all(r["status"] == "SUCCESS" for r in runs), "\n".join(_run_messages(server, r["runId"]) for r in runs)
    logs = {r["runId"]: _run_messages(server, r["runId"]) for r in runs}
    started = [run for run, text in logs.items() if "engine loading" in text]
    assert len(started) == 1, f"{len(started)} engine starts for one backfill: {logs}"
    mats = [m for m in _materializations(server, "labeled_outputs", "scatter") if m["run"] in logs]
    fresh = sorted(m["partition"] for m in mats if m["md"]["computed_in_this_run"])
    assert fresh == lost and {m["run"] for m in mats if m["md"]["computed_in_this_run"]} == set(started)
    assert all(m["md"]["generated_requests"] > 0 for m in mats if m["md"]["computed_in_this_run"])
    _open(server, page, "/assets/scatter/labeled_outputs")
    page.get_by_role("tab", name="Partitions").click()
    expect(page.get_by_text(re.compile(r"^Materialized \(\d+\)$"))).to_have_text(f"Materialized ({SHARDS})")
    _shot(server, page, "f2-partitions-green.png")
    assert not _engines(server.proc.pid), "the engine outlived its run"


def test_analytics_shows_the_calibration_chart(page: Any, server: Server) -> None:
    """(g) ``analytics`` of the ``scatter`` job (40 gold rows, the fake engine knowing some words):
    its metadata's "reliability and budget" entry opens, in the UI, as the chart itself (the PNG
    inline, not a path on the box that ran it)."""
    from dagster import DagsterInstance, materialize
    from playwright.sync_api import expect

    from sparkbatch_dagster import JobSpec, build_batch_assets
    from sparkbatch_dagster.testing import FakeVLLMResource

    inst = DagsterInstance.from_config(str(server.root / "dagster_home"))
    job = build_batch_assets(spec=JobSpec(**scatter_fields(server.root)), resource_key="fake", group_name="things")
    knows = dict(apple="fruit", banana="fruit", car="vehicle", truck="vehicle", dog="animal", cat="animal")
    res = {"fake": FakeVLLMResource(knows=knows)}
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    keys = sorted(inst.get_dynamic_partitions(job.partitions_def.name))
    labeled, measured = label_then_metrics(job.assets, job.keys, res, inst, keys[0], keys[-1])
    assert labeled.success and measured.success
    result = materialize(job.assets, selection=[job.keys["analytics"]], resources=res, instance=inst)
    [label] = [k for k in result.asset_materializations_for_node("scatter__analytics")[0].metadata
               if k.startswith("reliability and budget ")]
    [chart] = (server.root / "scatter-home" / "review").glob("calibration-*.png")
    width = PNG_WIDTH.unpack(chart.read_bytes()[16:20])[0]
    _open(server, page, "/assets/scatter/analytics")
    page.get_by_role("row").filter(has_text=label).get_by_text("[Show Markdown]").click()
    img = page.get_by_role("dialog").locator('img[src^="data:image/png;base64,"]')
    expect(img).to_be_visible()
    assert img.evaluate("i => i.complete && i.naturalWidth") == width  # decoded whole, the file's own picture
    _shot(server, page, "g1-calibration-chart.png")
    if SAVE:
        shutil.copyfile(server.shots / "g1-calibration-chart.png", REPO / "docs" / "ui" / "calibration-chart.png")
