"""Server mode against a real `vllm serve` on loopback (CPU, embedded SmolLM2)."""

import contextlib
import functools
import threading
import time

import psutil
import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, materialize

from sparkbatch_dagster import EngineError, VLLMResource, build_batch_assets
from sparkbatch_dagster.home import JobHome
from sparkbatch_dagster.inputs.shards import build_shards
from sparkbatch_dagster.testing import label_shard
from testkit import (
    EAGER,
    REAL_SETTINGS,
    confidence_tolerance,
    label_then_metrics,
    live_children,
    make_rows,
    make_spec,
    write_parquet,
)


def _vllm_children() -> list[psutil.Process]:
    return live_children("vllm", "serve")


def _label_all(job, res, inst):
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    labeled, measured = label_then_metrics(job.assets, job.keys, res, inst, keys[0], keys[-1])
    assert measured.success == labeled.success
    return labeled


def _titles(word: str, before: set[int]) -> set[str]:
    """The names (process titles) of this test's own live processes whose title holds ``word``."""
    found = set()
    for p in live_children(word):
        if p.pid not in before:
            with contextlib.suppress(psutil.Error):  # it exited while we looked
                found.add(" ".join(p.cmdline()).strip())
    return found


@pytest.mark.long
@pytest.mark.heavy  # two engine cores and three API frontends
def test_dagster_run_starts_and_stops_its_own_server_with_the_engines_and_frontends_it_asks_for(tmp_path):
    before = {p.pid for p in _vllm_children() + live_children("VLLM::")}  # the session's warm engine, if any
    spec = make_spec(tmp_path, n=40, shards=2)
    job = build_batch_assets(spec=spec)
    settings = {**REAL_SETTINGS, "keep_warm": False, "data_parallel_size": 2,
                "engine_kwargs": {**EAGER, "api_server_count": 3}}
    res = {"vllm": VLLMResource(engine="server", **settings)}
    assert res["vllm"].engine_count() == 2
    # vLLM names its processes: VLLM::EngineCore_DP<n> per data-parallel engine, VLLM::APIServer_<n> per frontend.
    # Counted by name, not pid: a process an engine core forks carries its name until it execs (seen: a third
    # "EngineCore_DP" pid in this test's tree, 3 == 2), and it is no engine of its own.
    engines: set[str] = set()
    frontends: set[str] = set()
    running = threading.Event()
    running.set()

    def watch():
        while running.is_set():  # this run's own: not the session's warm engine, nor any other process's
            engines.update(_titles("VLLM::EngineCore_DP", before))
            frontends.update(_titles("VLLM::APIServer_", before))
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = _label_all(job, res, DagsterInstance.get())
    finally:
        running.clear()
        watcher.join()
    assert result.success
    assert len(job.done_partitions(res["vllm"])) == 2
    assert engines == {"VLLM::EngineCore_DP0", "VLLM::EngineCore_DP1"}, engines  # data_parallel_size=2: vLLM's own two
    assert frontends == {f"VLLM::APIServer_{i}" for i in range(3)}, frontends  # --api-server-count 3 reached vLLM
    deadline = time.monotonic() + 60  # its processes exit on their own time: waited for, a hang bounded
    while {p.pid for p in _vllm_children() + live_children("VLLM::")} != before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert {p.pid for p in _vllm_children() + live_children("VLLM::")} == before  # nothing of it left running


# More connections than uvicorn's default backlog (2048): the server must listen with room for them.
SERVER = {**REAL_SETTINGS, "engine": "server", "max_in_flight": 3000}


@pytest.fixture(scope="module")
def server_engine():
    """One `vllm serve` for this module, kept warm: tests reach it through VLLMResource(**SERVER)."""
    resource = VLLMResource(**SERVER)
    engine = resource.get_engine()
    yield engine
    resource.shutdown()
    assert not engine.server.alive()


def test_a_server_started_here_batches_like_the_offline_engine(server_engine):
    """vLLM gives `vllm serve` half the offline max_num_batched_tokens (H200: 8192 vs 16384; this
    CPU: 2048 vs 4096); a batch job's server gets the offline defaults (0.83 -> ~1 of offline on an H200)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    tokens, seqs = EngineArgs.get_batch_defaults(1)  # this process: vLLM's own, unpatched tables
    assert tokens[UsageContext.OPENAI_API_SERVER] < tokens[UsageContext.LLM_CLASS]
    log = server_engine.server.log_path.read_text(errors="replace")
    assert (f"offline batch defaults: max_num_batched_tokens={tokens[UsageContext.LLM_CLASS]} "
            f"max_num_seqs={seqs[UsageContext.LLM_CLASS]} (its server defaults: "
            f"{tokens[UsageContext.OPENAI_API_SERVER]} and {seqs[UsageContext.OPENAI_API_SERVER]})") in log


def test_a_started_server_has_room_for_every_connection_and_keeps_them_between_runs(server_engine):
    """The client opens max_in_flight connections at once: the frontend listens with a backlog that
    holds them all (past it the kernel drops connection attempts, retried after 1, 3 and 7 s). Idle
    connections outlive vLLM's 5 s keep-alive, so a warm engine's next run reuses them."""
    import shutil
    import subprocess

    from sparkbatch_dagster import OutputSpec, SamplingSpec
    from sparkbatch_dagster.engines import EngineRequest

    port = int(server_engine.base_url.rsplit(":", 1)[1])
    assert "vllm serve listens with a backlog of 3000 connections" in server_engine.server.log_path.read_text()
    if shutil.which("ss"):  # a listening socket's Send-Q is its backlog
        listing = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True).stdout.split()
        assert listing[2] == "3000", listing
    env = psutil.Process(server_engine.server.proc.pid).environ()
    assert env["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] == "900"

    def client_ports() -> set[int]:
        return {c.laddr.port for c in psutil.Process().net_connections("tcp")
                if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED}

    reqs = [EngineRequest(str(i), [{"role": "user", "content": f"Say {i}."}]) for i in range(4)]
    list(server_engine.generate(reqs, SamplingSpec(max_tokens=2), OutputSpec(kind="text")))
    first = client_ports()
    assert first
    time.sleep(6)  # the idle time under test: longer than vLLM's default keep-alive (5 s)
    assert client_ports() == first
    list(server_engine.generate(reqs, SamplingSpec(max_tokens=2), OutputSpec(kind="text")))
    assert first <= client_ports()


def test_partition_completes_with_labels_and_error_rows(tmp_path, server_engine):
    rows = make_rows(60)
    rows[4]["text"] = "word " * 3000  # longer than max_model_len: the server refuses this row alone
    rows[5]["text"] = None
    src = write_parquet(tmp_path / "in" / "rows.parquet", rows)
    spec = make_spec(tmp_path, input=str(src), shards=2)
    job = build_batch_assets(spec=spec)
    res = {"vllm": VLLMResource(**SERVER)}
    assert _label_all(job, res, DagsterInstance.get()).success
    version = job.output_version(res["vllm"])
    out = {r["row_id"]: r for k in ("shard-00000", "shard-00001")
           for r in pq.read_table(job.home.labeled_path(version, k)).to_pylist()}
    assert len(out) == 60
    assert out["id-00004"]["error"].startswith("prompt_too_long")
    assert out["id-00005"]["error"].startswith("null_text")
    good = [r for k, r in out.items() if k not in ("id-00004", "id-00005")]
    assert all(r["output"] in spec.output.labels and r["prompt_tokens"] > 0 for r in good if not r["deduplicated"])


def test_the_server_says_when_an_answer_hit_max_tokens(server_engine):
    from sparkbatch_dagster import OutputSpec, SamplingSpec
    from sparkbatch_dagster.engines import EngineRequest

    reqs = [EngineRequest(str(i), [{"role": "user", "content": f"Tell me a long story about {w}."}])
            for i, w in enumerate(["apples", "trucks"])]
    cut = list(server_engine.generate(reqs, SamplingSpec(max_tokens=3), OutputSpec(kind="text")))
    assert sorted(r.finish_reason for r in cut) == ["length", "length"]
    whole = list(server_engine.generate(reqs, SamplingSpec(max_tokens=16),
                                        OutputSpec(kind="label", labels=["fruit", "vehicle", "animal"])))
    assert sorted(r.finish_reason for r in whole) == ["stop", "stop"]


def test_a_server_started_here_gets_token_ids_and_someone_elses_gets_chat_bodies(server_engine):
    from sparkbatch_dagster.engines.server.vllm_server import VLLMServerEngine

    # The module's server was started here: its rows above went as token ids to /v1/completions.
    assert server_engine._path == "/v1/completions" and server_engine._tokenizer is not None
    outside = VLLMResource(engine="server", server_url=server_engine.base_url, model=server_engine.served_name)
    engine = VLLMServerEngine(outside.engine_settings(), server_engine.base_url, server_engine.served_name)
    try:
        assert engine._path == "/v1/chat/completions" and engine._tokenizer is None
    finally:
        engine.close()


def test_a_server_that_does_not_serve_the_configured_model_stops_the_run(tmp_path, server_engine):
    spec = make_spec(tmp_path, n=20, shards=1)
    job = build_batch_assets(spec=spec)
    wrong = VLLMResource(engine="server", server_url=server_engine.base_url, model="some-other-model")
    inst = DagsterInstance.get()
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources={"vllm": wrong},
                       instance=inst).success
    result = materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources={"vllm": wrong},
                         instance=inst, partition_key="shard-00000", raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    message = str(failure.step_failure_data.error)
    assert f"serves ['{server_engine.served_name}'], not model='some-other-model'" in message
    assert "set VLLMResource.model" in message
    assert not list((job.home.root).rglob("part-*"))  # nothing written
    # The right name through the same URL: the identity is the server's own model, never the name alone.
    right = VLLMResource(engine="server", server_url=server_engine.base_url, model=server_engine.served_name)
    assert right.model_identity().startswith(server_engine.served_name + "@")


def _with_generation_config(folder, config):
    """The embedded SmolLM2 (weights linked, not copied) with ``config`` as its generation_config.json."""
    import json
    import shutil

    from sparkbatch_dagster.engines.platform.model import DEFAULT_MODEL_NAME, ensure_embedded

    src = ensure_embedded(DEFAULT_MODEL_NAME)
    folder.mkdir(parents=True)
    for f in src.iterdir():
        if f.suffix == ".safetensors":
            (folder / f.name).symlink_to(f)
        elif f.is_file():
            shutil.copy(f, folder / f.name)
    (folder / "generation_config.json").write_text(json.dumps(
        {**json.loads((src / "generation_config.json").read_text()), **config}))
    return folder


@pytest.mark.long
def test_offline_and_a_started_server_answer_alike_when_the_model_sets_sampling_defaults(tmp_path):
    """vLLM's server fills repetition_penalty, top_k and min_p from generation_config.json; offline
    SamplingParams would not: both modes apply them, so one identity means one answer."""
    from sparkbatch_dagster import OutputSpec, SamplingSpec
    from sparkbatch_dagster.engines import EngineRequest
    from sparkbatch_dagster.engines.platform.model import generation_defaults

    defaults = {"repetition_penalty": 1.3, "top_k": 20, "min_p": 0.1}
    model = _with_generation_config(tmp_path / "SmolLM2-135M-Instruct", defaults)
    assert generation_defaults(str(model)) == defaults
    words = ["apples", "trucks", "dogs", "rivers", "songs", "bread", "winter", "clocks"] * 3
    reqs = [EngineRequest(str(i), [{"role": "user", "content": f"Write one sentence about {w} (#{i})."}])
            for i, w in enumerate(words)]
    sampling, text = SamplingSpec(max_tokens=24), OutputSpec(kind="text")
    # float32: 24 free tokens from two engines agree only where an answer does not move with its
    # batch (in bf16 one near tie flips a sentence: exact_numerics in support/testkit.py).
    settings = {**REAL_SETTINGS, "model": str(model), "keep_warm": False, "dtype": "float32"}
    answers, identities = {}, {}
    for mode in ("offline", "server"):
        res = VLLMResource(engine=mode, **settings)
        try:
            identities[mode] = res.model_identity()
            answers[mode] = {r.id: r.text for r in res.get_engine().generate(reqs, sampling, text)}
        finally:
            res.close()
    assert identities["offline"] == identities["server"]
    assert len(answers["offline"]) == 24 and answers["offline"] == answers["server"]


def test_a_started_server_answers_labels_in_one_step_as_offline_does(server_engine, real_engine):
    """server_token_ids gives the client the tokenizer, so labels go as one step over their first
    tokens, asked again with the grammar where that token begins several (``label_tokens``): the
    offline engine's answers."""
    from real.test_label_tokens import SECTIONS, SENTIMENT, _answers

    tolerance = confidence_tolerance()
    for labels in (SENTIMENT, SECTIONS):
        served, offline = _answers(server_engine, "auto", labels), _answers(real_engine, "auto", labels)
        assert {k: r.text for k, r in served.items()} == {k: r.text for k, r in offline.items()}
        assert {k: r.output_tokens for k, r in served.items()} == {k: r.output_tokens for k, r in offline.items()}
        for k, r in offline.items():  # and as sure (test_confidence_real.py checks offline's against the model)
            assert served[k].confidence == pytest.approx(r.confidence, abs=tolerance)


def test_a_started_server_sends_the_rest_to_the_grammar_when_the_probe_is_mostly_asked_again(server_engine, caplog):
    """The client holds the rest until the probe's 3 rows are answered (``label_tokens.Tally``)."""
    from real.test_label_tokens import check_probed, probed

    with caplog.at_level("INFO", logger="sparkbatch"):
        fast, grammar = probed(server_engine, 3)
    check_probed(fast, grammar, 3, caplog.text)


def test_a_started_server_answers_alike_with_bodies_built_on_their_own_thread_or_inline(server_engine, monkeypatch):
    """Bodies are built and tokenized a chunk at a time on the encoding thread (encode_ahead.py);
    in chunks of 4 here, so chunks and answers interleave: the same answers as built inline."""
    from sparkbatch_dagster import OutputSpec, SamplingSpec
    from sparkbatch_dagster.engines import EngineRequest
    from sparkbatch_dagster.engines.answers.encode_ahead import Prepared
    from sparkbatch_dagster.engines.server import token_prompts, vllm_server

    threads: list[str] = []
    original = token_prompts.token_bodies

    def recording(tokenizer, bodies):
        threads.append(threading.current_thread().name)
        return original(tokenizer, bodies)

    monkeypatch.setattr(vllm_server, "token_bodies", recording)
    monkeypatch.setattr(server_engine, "chunk", 4)
    reqs = [EngineRequest(str(i), [{"role": "user", "content": f"Name a word that rhymes with {w}."}])
            for i, w in enumerate(["cat", "dog", "tree", "blue", "sun", "car"] * 3)]
    answers = {}
    for threaded in (True, False):
        monkeypatch.setattr(vllm_server, "Prepared", functools.partial(Prepared, threaded=threaded))
        threads.clear()
        got = list(server_engine.generate(reqs, SamplingSpec(max_tokens=6, temperature=0.0), OutputSpec(kind="text")))
        answers[threaded] = {r.id: (r.text, r.prompt_tokens) for r in got}
        assert len(threads) == 5 and all(t.startswith("sparkbatch-encode") for t in threads) == threaded
        assert any(t.startswith("sparkbatch-encode") for t in threads) == threaded
    assert len(answers[True]) == 18 and answers[True] == answers[False]


def test_a_started_server_answers_alike_with_several_prompts_per_request_or_one(server_engine, monkeypatch):
    """A server started here gets up to 16 prompts per completions request (prompt_groups.py):
    each row's text, token counts and confidence as when it goes alone, in fewer requests."""
    from sparkbatch_dagster import OutputSpec, SamplingSpec
    from sparkbatch_dagster.engines import EngineRequest

    groups = server_engine.groups
    assert groups.size == 16
    reqs = [EngineRequest(str(i), [{"role": "user", "content": f"Name a word that rhymes with {w}."}])
            for i, w in enumerate(["cat", "dog", "tree", "blue", "sun", "car"] * 4)]
    sampling = SamplingSpec(max_tokens=6, temperature=0.0)
    answers, requests = {}, {}
    for size in (16, 1):
        monkeypatch.setattr(groups, "size", size)
        before = groups.requests
        got = list(server_engine.generate(reqs, sampling, OutputSpec(kind="text")))
        requests[size] = groups.requests - before
        answers[size] = {r.id: (r.text, r.prompt_tokens, r.output_tokens, r.finish_reason, r.error) for r in got}
    assert len(answers[16]) == 24 and answers[16] == answers[1]
    assert all(error is None and out > 0 for _, _, out, _, error in answers[16].values())
    assert requests[1] == 24 and requests[16] < 24


def test_a_chat_server_gives_the_confidence_by_token_text(server_engine, real_engine):
    """Someone else's server is asked in chat messages, without the tokenizer here: the grammar
    answers, and its log-probabilities come back keyed by token text, not id."""
    from real.test_label_tokens import SECTIONS, SENTIMENT, _answers
    from sparkbatch_dagster.engines.server.vllm_server import VLLMServerEngine

    outside = VLLMResource(engine="server", server_url=server_engine.base_url, model=server_engine.served_name,
                           server_token_ids=False)
    chat = VLLMServerEngine(outside.engine_settings(), server_engine.base_url, server_engine.served_name)
    tolerance = confidence_tolerance()
    try:
        for labels in (SENTIMENT, SECTIONS):
            served, offline = _answers(chat, "auto", labels), _answers(real_engine, "grammar", labels)
            assert {k: r.text for k, r in served.items()} == {k: r.text for k, r in offline.items()}
            for k, r in offline.items():
                assert served[k].confidence == pytest.approx(r.confidence, abs=tolerance)
    finally:
        chat.close()
    assert server_engine.server.alive()  # the chat client's close leaves the server it did not start


def test_a_started_server_honours_a_batch_lines_own_fields_by_token_ids_and_in_chat(server_engine, real_engine):
    """A batch line's stop, n, logprobs, penalties, top_k and logit_bias through `vllm serve`:
    as completions of token ids (a server started here) and as chat bodies (someone else's)."""
    from real.test_real_batch_fields import check_fields
    from sparkbatch_dagster.engines.server.vllm_server import VLLMServerEngine

    check_fields(server_engine, real_engine._tokenizer)
    outside = VLLMResource(engine="server", server_url=server_engine.base_url, model=server_engine.served_name,
                           server_token_ids=False)
    chat = VLLMServerEngine(outside.engine_settings(), server_engine.base_url, server_engine.served_name)
    try:
        check_fields(chat, real_engine._tokenizer)
    finally:
        chat.close()


def test_killed_server_fails_promptly_is_stopped_whole_and_a_rerun_resumes(tmp_path, server_engine, real_engine):
    """Runs last in this module: it kills the module's server, its leader alone (as the OOM killer
    would), leaving the engine core and frontend children it started."""
    spec = make_spec(tmp_path, n=300, shards=1, checkpoint_rows=5, checkpoint_seconds=0.2)
    home = JobHome(spec.home_path)
    build_shards(spec, home)
    version = "00000000000000dd"
    outcome: dict = {}

    def work():
        try:
            label_shard(spec, home, version, "shard-00000", server_engine)
        except Exception as exc:  # what we are testing for
            outcome["error"] = exc

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    parts = home.parts_dir(version, "shard-00000")
    deadline = time.monotonic() + 600  # only bounds a hang: a loaded CPU generates slowly
    while not list(parts.glob("part-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    server = psutil.Process(server_engine.server.proc.pid)
    children = server.children(recursive=True)
    assert children  # vLLM's engine core at least
    server.kill()
    killed = time.monotonic()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the run hung after the server died"
    assert isinstance(outcome.get("error"), EngineError) and time.monotonic() - killed < 60
    assert any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in children)  # orphans, still alive
    server_engine.server.stop()
    assert not [p.pid for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    kept = sum(pq.read_metadata(p).num_rows for p in parts.glob("part-*"))
    assert kept >= 5
    # The rerun (here on the offline engine, same model) sends only the rows not yet written.
    stats = label_shard(spec, home, version, "shard-00000", real_engine)
    assert stats.rows == 300 and stats.resumed_rows == kept
