"""Server-mode failures, sorted three ways, against a local stub of an OpenAI-compatible server:
a row's own (an error row), a setting's (ConfigError before any row is written), a transient
one (pending: nothing written, the next run retries it)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pyarrow.parquet as pq
import pytest
from aiohttp import web

from local_server import LocalServer
from sparkbatch_dagster.engines.base import EngineRequest
from sparkbatch_dagster.engines.config import EngineSettings
from sparkbatch_dagster.engines.server.endpoints import check_served, served_models
from sparkbatch_dagster.engines.server.server_process import free_port
from sparkbatch_dagster.engines.server.vllm_server import VLLMServerEngine
from sparkbatch_dagster.errors import ConfigError, EngineError, PendingRowsError
from sparkbatch_dagster.spec import OutputSpec, SamplingSpec
from sparkbatch_dagster.testing import label_shard
from testkit import LABELS, make_rows, make_spec, one_shard, written_parts

V, KEY = "00000000000000aa", "shard-00000"
TOO_LONG = "This model's maximum context length is 1024 tokens. However, your prompt contains 3000 input tokens."
NO_TEMPLATE = ("As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat "
               "template if the tokenizer does not define one.")


class Stub(LocalServer):
    """``/v1/models`` and ``/v1/chat/completions`` in a thread; each test sets how they fail."""

    def __init__(self) -> None:
        self.models, self.key, self.answer_as = ["m"], None, None
        self.rules: list[tuple[str, int, str]] = []  # (prompt substring, status, message): first match fails
        self.flaky, self.delay = 0, 0.0  # first `flaky` attempts of each prompt get 503; seconds per answer
        self.attempts: Counter[str] = Counter()
        self.keys_seen: set[str | None] = set()  # Authorization headers received
        super().__init__([web.get("/v1/models", self.list_models), web.post("/v1/chat/completions", self.chat)])

    @staticmethod
    def error(status: int, message: str) -> web.Response:
        return web.json_response({"error": {"message": message, "type": "Error", "code": status}}, status=status)

    def denied(self, request: web.Request) -> web.Response | None:
        self.keys_seen.add(request.headers.get("Authorization"))
        ok = self.key is None or request.headers.get("Authorization") == f"Bearer {self.key}"
        return None if ok else self.error(401, "Unauthorized")

    async def list_models(self, request: web.Request) -> web.Response:
        return self.denied(request) or web.json_response(
            {"object": "list", "data": [{"id": m, "root": "/models/x", "max_model_len": 1024} for m in self.models]})

    async def chat(self, request: web.Request) -> web.Response:
        if denied := self.denied(request):
            return denied
        body = await request.json()
        if body["model"] not in self.models:
            return self.error(404, f"The model `{body['model']}` does not exist.")
        prompt = body["messages"][-1]["content"]
        self.attempts[prompt] += 1
        for part, status, message in self.rules:
            if part in prompt:
                return self.error(status, message)
        if self.attempts[prompt] <= self.flaky:
            return self.error(503, "overloaded")
        await asyncio.sleep(self.delay)
        return web.json_response({"model": self.answer_as or body["model"],
                                  "choices": [{"message": {"content": LABELS[len(prompt) % 3]}}],
                                  "usage": {"prompt_tokens": 12, "completion_tokens": 1}})


@pytest.fixture
def stub():
    server = Stub()
    yield server
    server.stop()


class _Quick(VLLMServerEngine):
    backoff_s = 0.01  # a local stub's retries need no pause


def _client(urls: str | list[str], **fields: Any) -> VLLMServerEngine:
    """A client of ``urls`` serving "m", with these ``VLLMResource`` fields."""
    cfg = EngineSettings(engine="server", model="m", endpoints=tuple([urls] if isinstance(urls, str) else urls),
                         **fields)
    return _Quick(cfg, urls, "m")


def _engine(stub: Stub, **kw) -> VLLMServerEngine:
    # request_timeout_s only bounds a hang: an answer from the local stub is never waited for that long.
    return _client(stub.url, **{"max_retries": 2, "request_timeout_s": 30.0, **kw})


def _generate(engine: VLLMServerEngine, prompts: list[str]) -> dict[str, object]:
    reqs = [EngineRequest(str(i), [{"role": "user", "content": p}]) for i, p in enumerate(prompts)]
    out = OutputSpec(kind="label", labels=LABELS)
    with engine:
        return {prompts[int(r.id)]: r for r in engine.generate(reqs, SamplingSpec(max_tokens=4), out)}


PROMPTS = [f"prompt {i}" for i in range(40)]


# --- engine level -------------------------------------------------------------------------


def test_served_models_and_check_served(stub):
    stub.models = ["m", "alias"]
    assert [m["id"] for m in served_models(stub.url + "/v1/", None)] == ["m", "alias"]
    assert check_served(stub.url, "m", None) == {"id": "m", "root": "/models/x", "max_model_len": 1024}
    with pytest.raises(ConfigError, match=r"serves \['m', 'alias'\], not model='x': set VLLMResource.model"):
        check_served(stub.url, "x", None)
    gone = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EngineError, match=f"server at {gone} unreachable"):
        served_models(gone, None, timeout_s=2)


@pytest.mark.parametrize("key", [None, "wrong"])
def test_wrong_key_stops_before_any_request(stub, key):
    stub.key = "secret"
    with pytest.raises(ConfigError, match=r"HTTP 401.*set VLLMResource.api_key to the server's key.*EnvVar"):
        _engine(stub, api_key=key)
    assert not stub.attempts


def test_key_refused_mid_run_is_a_config_error(stub):
    stub.key = "secret"
    engine = _engine(stub, api_key="secret")
    stub.key = "rotated"
    with pytest.raises(ConfigError, match="VLLMResource.api_key"):
        _generate(engine, PROMPTS)


def test_unknown_model_lists_what_the_server_serves(stub):
    stub.models = ["other"]
    with pytest.raises(ConfigError, match=r"serves \['other'\], not model='m'"):
        _engine(stub)
    stub.models = ["m"]
    engine = _engine(stub)
    stub.models = ["other", "more"]  # unloaded while we run: the 404 says what is served now
    with pytest.raises(ConfigError, match=r"serves \['other', 'more'\], not model='m'"):
        _generate(engine, PROMPTS)


def test_400_on_every_request_is_a_config_error_and_stops_sending(stub):
    stub.rules = [("", 400, "some validation error")]
    with pytest.raises(ConfigError, match="every request fails with HTTP 400: some validation error: check "
                                          "VLLMResource.model and the job's output/sampling settings"):
        _generate(_engine(stub, max_in_flight=4), PROMPTS)
    assert sum(stub.attempts.values()) <= 8 + 4  # held ones, plus those already in flight


def test_no_chat_template_is_a_config_error(stub):
    stub.rules = [("", 400, NO_TEMPLATE)]
    with pytest.raises(ConfigError, match="no chat template: use a chat .instruct. model.*--chat-template"):
        _generate(_engine(stub), PROMPTS)


def test_another_model_answering_is_a_config_error(stub):
    stub.answer_as = "someone-else"
    with pytest.raises(ConfigError, match="answered as model 'someone-else', not 'm'"):
        _generate(_engine(stub), PROMPTS)


def test_vllm_answers_with_its_first_served_name(stub):
    stub.models, stub.answer_as = ["first", "m"], "first"  # `--served-model-name first m`
    assert all(r.error is None for r in _generate(_engine(stub), PROMPTS).values())


def test_row_errors_are_rows_once_something_succeeded(stub):
    stub.rules = [("LONG", 400, TOO_LONG), ("odd", 400, "some validation error")]
    res = _generate(_engine(stub), ["LONG one", "odd one", *PROMPTS])
    assert res["LONG one"].error.startswith("prompt_too_long: HTTP 400: This model's maximum context length")
    assert res["odd one"].error == "bad_request: HTTP 400: some validation error"
    assert not res["LONG one"].retryable and all(res[p].text in LABELS for p in PROMPTS)


def test_retries_through_503s(stub):
    stub.flaky = 2
    res = _generate(_engine(stub), PROMPTS)
    assert all(r.text in LABELS for r in res.values()) and set(stub.attempts.values()) == {3}


def test_503_forever_and_slow_answers_are_retryable(stub):
    stub.rules = [("prompt 1", 503, "overloaded")]
    res = _generate(_engine(stub), PROMPTS)
    failed = {p for p, r in res.items() if r.error}
    assert failed == {p for p in PROMPTS if "prompt 1" in p}
    assert all(res[p].retryable and res[p].error.startswith("server_error: HTTP 503") for p in failed)
    # Answers that would come after a minute: the client gives up at its own timeout (0.2 s, twice),
    # far sooner, however loaded the machine.
    stub.rules, stub.delay = [], 60.0
    started = time.monotonic()
    res = _generate(_engine(stub, request_timeout_s=0.2, max_retries=1), PROMPTS[:5])
    assert all(r.retryable and "no answer in 0.2s" in r.error for r in res.values())
    assert time.monotonic() - started < 30


def test_held_400s_among_transient_failures_stay_pending(stub):
    stub.rules = [("prompt 1", 400, "some validation error"), ("", 503, "overloaded")]
    assert all(r.retryable for r in _generate(_engine(stub), PROMPTS).values())


def test_unreachable_server_fails_the_run(stub):
    engine = _engine(stub)
    stub.stop()
    with pytest.raises(EngineError, match="unreachable after 2 retries"):
        _generate(engine, PROMPTS)


# --- through the runner -------------------------------------------------------------------


@pytest.mark.parametrize("setup, setting", [
    (lambda s: setattr(s, "key", "secret"), "VLLMResource.api_key"),
    (lambda s: setattr(s, "models", ["other"]), "model='m'"),
    (lambda s: setattr(s, "rules", [("", 400, "some validation error")]), "VLLMResource.model"),
    (lambda s: setattr(s, "rules", [("", 400, NO_TEMPLATE)]), "--chat-template"),
], ids=["401", "404", "400-always", "chat-template"])
def test_config_errors_stop_the_run_before_any_row(tmp_path, stub, setup, setting):
    spec, home = one_shard(tmp_path, make_rows(30))
    setup(stub)
    with pytest.raises(ConfigError, match=setting), _engine(stub) as engine:
        label_shard(spec, home, V, KEY, engine)
    assert not home.is_done(V, KEY)
    assert not [r for r in written_parts(home, V, KEY) if (r["error"] or "").startswith("bad_request")]


def test_flaky_server_commits_every_row_labeled(tmp_path, stub):
    spec, home = one_shard(tmp_path, make_rows(30))
    stub.flaky = 2
    with _engine(stub) as engine:
        stats = label_shard(spec, home, V, KEY, engine)
    out = pq.read_table(home.labeled_path(V, KEY)).to_pylist()
    assert len(out) == 30 and all(r["output"] in LABELS for r in out) and stats.errors == 0


def test_too_long_row_is_an_error_row_and_the_rest_complete(tmp_path, stub):
    rows = make_rows(30)
    rows[4]["text"] = "LONG " * 50
    spec, home = one_shard(tmp_path, rows)
    stub.rules = [("LONG", 400, TOO_LONG)]
    with _engine(stub) as engine:
        label_shard(spec, home, V, KEY, engine)
    out = {r["row_id"]: r for r in pq.read_table(home.labeled_path(V, KEY)).to_pylist()}
    assert out.pop("id-00004")["error"].startswith("prompt_too_long")
    assert len(out) == 29 and all(r["output"] in LABELS for r in out.values())


@pytest.mark.parametrize("failing", ["", "day 3."], ids=["all", "some"])
def test_transient_failures_stay_pending_and_a_rerun_completes_them(tmp_path, stub, failing):
    rows = make_rows(30)
    spec, home = one_shard(tmp_path, rows)
    stub.rules = [(failing, 503, "overloaded")]
    with pytest.raises(PendingRowsError) as err, _engine(stub) as engine:
        label_shard(spec, home, V, KEY, engine)
    pending = [r for r in rows if failing in f"What kind of thing is this? {r['text']}"]
    assert f"{len(pending)} rows" in str(err.value)
    assert not home.is_done(V, KEY)
    kept = written_parts(home, V, KEY)
    assert not [r for r in kept if r["error"]] and len(kept) == 30 - len(pending)
    stub.rules, stub.attempts = [], Counter()
    with _engine(stub) as engine:
        stats = label_shard(spec, home, V, KEY, engine)
    assert sorted(stub.attempts) == sorted({f"What kind of thing is this? {r['text']}" for r in pending})
    assert stats.rows == 30 and stats.resumed_rows == len(kept) and stats.errors == 0


# --- the API key through Dagster: EnvVar, read when the run starts ------------------------------


def _keyed_defs(tmp_path, stub):
    from dagster import Definitions, EnvVar

    from sparkbatch_dagster import VLLMResource, build_batch_assets

    stub.key = "secret"
    job = build_batch_assets(spec=make_spec(tmp_path, n=30, shards=2))
    resource = VLLMResource(engine="server", server_url=stub.url, model="m", api_key=EnvVar("SB_TEST_KEY"),
                            max_retries=1, request_timeout_s=30.0)
    return job, Definitions(assets=job.assets, resources={"vllm": resource})


def _run(job, defs):
    from dagster import DagsterInstance, materialize

    from sparkbatch_dagster.cli.commands import RANGE_END, RANGE_START

    inst = DagsterInstance.get()
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=defs.resources,
                       instance=inst).success  # no engine needed: the key is not read
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    return materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources=defs.resources,
                       instance=inst, tags={RANGE_START: keys[0], RANGE_END: keys[-1]})


def test_api_key_from_an_env_var_is_sent_with_every_request(tmp_path, stub, monkeypatch):
    monkeypatch.setenv("SB_TEST_KEY", "secret")
    job, defs = _keyed_defs(tmp_path, stub)
    assert "secret" not in repr(defs.resources["vllm"])  # the definition holds the variable's name only
    assert _run(job, defs).success
    assert stub.keys_seen == {"Bearer secret"} and sum(stub.attempts.values()) > 0
    assert len(job.done_partitions(defs.resources["vllm"])) == 2  # outside a run (CLI status): read too


def test_an_unset_api_key_variable_stops_the_run_before_any_request(tmp_path, stub, monkeypatch):
    from dagster import DagsterInvalidConfigError

    monkeypatch.delenv("SB_TEST_KEY", raising=False)
    job, defs = _keyed_defs(tmp_path, stub)
    with pytest.raises(DagsterInvalidConfigError, match='environment variable "SB_TEST_KEY" which is not set'):
        _run(job, defs)  # Dagster's own check, before the run's first step
    with pytest.raises(ConfigError, match=r"VLLMResource\(api_key=EnvVar\('SB_TEST_KEY'\)\) reads an environment "
                                          "variable that is not set: export it"):
        job.output_version(defs.resources["vllm"])  # outside a run: the CLI's status, preview, a notebook
    assert not stub.attempts and stub.keys_seen <= {None}


def test_the_cli_names_an_unset_api_key_variable_in_one_line(tmp_path, stub, monkeypatch, capsys):
    from sparkbatch_dagster.cli import main as cli_main

    monkeypatch.delenv("SB_TEST_KEY", raising=False)
    make_spec(tmp_path, n=30, shards=2)  # its input file
    defs = tmp_path / "defs.py"
    defs.write_text(
        "from pathlib import Path\n"
        "from dagster import Definitions, EnvVar\n"
        "from testkit import make_spec\n"
        "from sparkbatch_dagster import VLLMResource, build_batch_assets\n"
        f"job = build_batch_assets(spec=make_spec(Path({str(tmp_path)!r}), n=30, shards=2))\n"
        f"vllm = VLLMResource(engine='server', server_url={stub.url!r}, model='m', api_key=EnvVar('SB_TEST_KEY'))\n"
        "defs = Definitions(assets=job.assets, resources={'vllm': vllm})\n"
    )
    assert cli_main(["run", "-f", str(defs)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()[-1:]
    assert line.startswith("sparkbatch: VLLMResource(api_key=EnvVar('SB_TEST_KEY')) reads an environment variable")
    assert not stub.attempts
