"""The tests of tests/unit/test_replicas.py that start processes: the CLI, Dagster runs (their
log capture), servers, kills. That file says what they cover."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pyarrow.parquet as pq
import pytest
from aiohttp import web

from local_server import LocalServer
from sparkbatch_dagster import VLLMResource
from sparkbatch_dagster.engines.base import EngineRequest
from sparkbatch_dagster.engines.config import EngineSettings
from sparkbatch_dagster.engines.server.server_process import free_port
from sparkbatch_dagster.engines.server.vllm_server import VLLMServerEngine
from sparkbatch_dagster.errors import ConfigError, EngineError, PendingRowsError
from sparkbatch_dagster.spec import OutputSpec, SamplingSpec
from sparkbatch_dagster.testing import label_shard
from testkit import LABELS, make_rows, make_spec, one_shard, written_parts

V, KEY = "00000000000000aa", "shard-00000"
TOO_LONG = "This model's maximum context length is 1024 tokens. However, your prompt contains 3000 input tokens."


class Server(LocalServer):
    """One stub server in a thread: ``/v1/models`` and ``/v1/chat/completions``."""

    def __init__(self, root: str = "/models/x") -> None:
        self.models, self.root, self.delay = ["m"], root, 0.0
        self.failing: str | None = None  # a prompt substring answered 503 forever ("" = every prompt)
        self.too_long = "LONG"  # prompts with this are over the context: a 400, the row's own
        self.fail_after: int | None = None  # after this many answers: 503 forever
        self.crash_after: int | None = None  # after this many answers: the server stops (connections refused)
        self.crashed = False
        self.answered: Counter[str] = Counter()  # 200s, by prompt
        self.attempts: Counter[str] = Counter()
        self.in_flight = self.most_in_flight = 0
        self.hold: Callable[[], bool] | None = None  # answers wait (in flight) until this says go
        self.bodies: list[dict] = []  # /v1/completions requests, as sent
        super().__init__([web.get("/v1/models", self.list_models), web.post("/v1/chat/completions", self.chat),
                          web.post("/v1/completions", self.completions)])

    async def list_models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": m, "root": self.root, "max_model_len": 1024} for m in self.models]})

    @staticmethod
    def error(status: int, message: str) -> web.Response:
        return web.json_response({"error": {"message": message, "type": "Error", "code": status}}, status=status)

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt = body["messages"][-1]["content"]
        self.attempts[prompt] += 1
        done = sum(self.answered.values())
        if self.fail_after is not None and done >= self.fail_after or (
                self.failing is not None and self.failing in prompt):
            return self.error(503, "overloaded")
        if self.too_long in prompt:
            return self.error(400, TOO_LONG)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            while self.hold is not None and not self.hold():
                await asyncio.sleep(0.01)
            await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        if self.crash_after is not None and done >= self.crash_after:
            if not self.crashed:
                self.crashed = True
                asyncio.get_running_loop().create_task(self.runner.cleanup())  # gone, mid-request
            await asyncio.sleep(1)  # cancelled by the shutdown: the connection drops unanswered
        self.answered[prompt] += 1
        return web.json_response({"model": body["model"],
                                  "choices": [{"message": {"content": LABELS[len(prompt) % 3]}}],
                                  "usage": {"prompt_tokens": 12, "completion_tokens": 1}})

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        return web.json_response({"model": body["model"], "choices": [{"index": 0, "text": LABELS[0]}],
                                  "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": 1}})


@pytest.fixture
def two():
    pair = (Server(), Server())
    yield pair
    for rep in pair:
        if rep.runner.server is not None:
            rep.stop()


class _Quick(VLLMServerEngine):
    backoff_s = 0.01  # a local stub's retries need no pause


def _client(urls: str | list[str], **fields: Any) -> VLLMServerEngine:
    """A client of ``urls`` serving "m", with these ``VLLMResource`` fields."""
    cfg = EngineSettings(engine="server", model="m", endpoints=tuple([urls] if isinstance(urls, str) else urls),
                         **fields)
    return _Quick(cfg, urls, "m")


def _engine(reps, **kw) -> VLLMServerEngine:
    # request_timeout_s only bounds a hang: an answer from a local stub is never waited for that long.
    return _client([r.url for r in reps], **{"max_retries": 2, "request_timeout_s": 30.0, **kw})


def _generate(engine: VLLMServerEngine, prompts: list[str]) -> dict[str, object]:
    reqs = [EngineRequest(str(i), [{"role": "user", "content": p}]) for i, p in enumerate(prompts)]
    out = OutputSpec(kind="label", labels=LABELS)
    with engine:
        results = list(engine.generate(reqs, SamplingSpec(max_tokens=4), out))
    assert sorted(int(r.id) for r in results) == list(range(len(prompts)))  # every row exactly once
    return {prompts[int(r.id)]: r for r in results}


def _answered(reps) -> Counter[str]:
    return sum((r.answered for r in reps), Counter())


PROMPTS = [f"prompt {i}" for i in range(60)]


# --- balance -----------------------------------------------------------------------------------


def test_two_healthy_replicas_share_the_load(two):
    for rep in two:
        rep.delay = 0.05
    res = _generate(_engine(two, max_in_flight=4), PROMPTS)
    assert all(r.text in LABELS for r in res.values())
    assert _answered(two) == Counter(PROMPTS)  # each prompt answered once, by one replica
    a, b = (sum(r.answered.values()) for r in two)
    assert min(a, b) >= 15, (a, b)  # equal speed: about half each (by in-flight count, so not exactly)
    assert all(r.most_in_flight <= 4 for r in two)  # each replica's own bound


def test_a_slow_replica_gets_fewer_rows(two):
    slow, fast = two
    # The slow one answers only once the fast one has answered every other prompt: whatever the
    # machine's speed, it holds its first requests (max_in_flight of them) all along.
    slow.hold = lambda: sum(fast.answered.values()) >= len(PROMPTS) - 4
    _generate(_engine(two, max_in_flight=4, request_timeout_s=300.0), PROMPTS)
    assert _answered(two) == Counter(PROMPTS)
    n_slow, n_fast = sum(slow.answered.values()), sum(fast.answered.values())
    assert n_slow >= 1 and n_fast > 4 * n_slow, (n_slow, n_fast)


def test_row_errors_stay_row_errors_whichever_replica_answers(two):
    prompts = [f"LONG {i}" for i in range(6)] + PROMPTS
    res = _generate(_engine(two, max_in_flight=4), prompts)
    assert all(res[p].error.startswith("prompt_too_long: HTTP 400") and not res[p].retryable for p in prompts[:6])
    assert all(sum(r.attempts[p] for r in two) == 1 for p in prompts[:6])  # never re-sent
    assert all(r.answered for r in two)


# --- a dead replica ----------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["503-forever", "crash"])
def test_a_replica_that_dies_mid_run_has_its_rows_answered_by_the_other(two, how, caplog):
    live, dying = two
    live.delay = dying.delay = 0.01
    if how == "crash":
        dying.crash_after = 5
    else:
        dying.fail_after = 5
    with caplog.at_level(logging.WARNING, logger="sparkbatch"):
        res = _generate(_engine(two, max_in_flight=4), PROMPTS)
    assert all(r.error is None and r.text in LABELS for r in res.values())
    assert _answered(two) == Counter(PROMPTS)  # nothing answered twice, nothing lost
    assert sum(dying.answered.values()) <= 5 + 4 and sum(live.answered.values()) >= 60 - 9
    assert f"server at {dying.url} is dead" in caplog.text and "rows moved off dead servers" in caplog.text


def test_a_poisoned_row_is_pending_and_the_rest_complete(two):
    for rep in two:
        rep.failing, rep.delay = "prompt 7", 0.02  # 503 for this prompt on every replica
    res = _generate(_engine(two, max_in_flight=4), PROMPTS)
    assert res["prompt 7"].retryable and res["prompt 7"].error.startswith("server_error: ")
    assert sum(r.attempts["prompt 7"] for r in two) == 2 * 3  # its retries on each replica
    assert all(r.error is None for p, r in res.items() if p != "prompt 7")


def test_an_unreachable_replica_at_start_is_left_out(two, caplog):
    gone = f"http://127.0.0.1:{free_port()}"
    with caplog.at_level(logging.WARNING, logger="sparkbatch"):
        engine = _client([gone, *(r.url for r in two)], max_retries=1)
    assert f"server at {gone} unreachable" in caplog.text and "left out of this run" in caplog.text
    assert [r.url for r in engine.pool.replicas] == [r.url for r in two]
    assert _answered(two) == Counter() and all(r.error is None for r in _generate(engine, PROMPTS).values())
    with pytest.raises(EngineError, match="none of the 2 servers in server_urls answers"):
        _client([gone, f"http://127.0.0.1:{free_port()}"])


# --- every replica dead: pending, through the runner ------------------------------------------


@pytest.mark.parametrize("how", ["503-forever", "crash"])
def test_the_runner_commits_every_row_when_one_replica_dies(tmp_path, two, how):
    spec, home = one_shard(tmp_path, make_rows(40))
    live, dying = two
    live.delay = dying.delay = 0.01
    setattr(dying, "crash_after" if how == "crash" else "fail_after", 4)
    with _engine(two, max_in_flight=3) as engine:
        stats = label_shard(spec, home, V, KEY, engine)
    out = pq.read_table(home.labeled_path(V, KEY)).to_pylist()
    assert sorted(r["row_id"] for r in out) == [f"id-{i:05d}" for i in range(40)]
    assert all(r["output"] in LABELS for r in out) and stats.errors == 0
    assert all(n == 1 for n in _answered(two).values())  # no prompt generated twice


def test_every_replica_dead_leaves_rows_pending_and_a_rerun_completes(tmp_path, two):
    spec, home = one_shard(tmp_path, make_rows(40))
    for rep in two:
        rep.delay, rep.fail_after = 0.01, 3
    with pytest.raises(PendingRowsError, match="every server is dead") as err, _engine(two, max_in_flight=2) as engine:
        label_shard(spec, home, V, KEY, engine)
    assert not home.is_done(V, KEY)
    kept = written_parts(home, V, KEY)
    assert not [r for r in kept if r["error"]] and len(kept) < 20
    assert f"{40 - len(kept)} rows in ['shard-00000'] got only transient failures" in str(err.value)
    two[0].fail_after, before = None, _answered(two)  # one replica back; the other still failing
    with _engine(two, max_in_flight=2) as engine:
        stats = label_shard(spec, home, V, KEY, engine)
    assert stats.rows == 40 and stats.resumed_rows == len(kept) and stats.errors == 0
    assert not (_answered(two) - before) & before  # the rerun generated only the pending rows


def test_crashed_replicas_leave_rows_pending_not_a_failed_run(tmp_path, two):
    spec, home = one_shard(tmp_path, make_rows(30))
    for rep in two:
        rep.delay, rep.crash_after = 0.01, 2
    with pytest.raises(PendingRowsError, match="every server is dead"), _engine(two, max_in_flight=2) as engine:
        label_shard(spec, home, V, KEY, engine)
    assert not home.is_done(V, KEY)


# --- one model on every replica ---------------------------------------------------------------


def test_replicas_serving_another_model_stop_before_any_row(two):
    two[1].models = ["other"]
    with pytest.raises(ConfigError, match=rf"server at {two[1].url} serves \['other'\], not model='m'"):
        _engine(two)
    two[1].models, two[1].root = ["m"], "/models/y"  # the same name, other weights
    with pytest.raises(ConfigError, match=rf"server at {two[1].url} serves 'm' with root='/models/y'.*but server at "
                                          rf"{two[0].url} with root='/models/x'.*must serve the same model"):
        _engine(two)
    res = VLLMResource(engine="server", server_urls=[r.url for r in two], model="m")
    with pytest.raises(ConfigError, match=rf"server at {two[1].url} serves 'm'"):
        res.model_identity()
    assert not _answered(two) and not any(r.attempts for r in two)


def test_the_identity_of_several_replicas_is_that_of_one(two):
    several = VLLMResource(engine="server", server_urls=[r.url for r in two], model="m")
    one = VLLMResource(engine="server", server_url=two[0].url, model="m")
    assert several.model_identity() == one.model_identity() and one.model_identity().startswith("m@")
    assert several.resolved_max_num_seqs() == 1024  # someone else's servers
    with pytest.raises(ConfigError, match="sets both server_url and server_urls"):
        VLLMResource(engine="server", server_url=two[0].url, server_urls=[two[1].url], model="m").model_identity()
    with pytest.raises(ConfigError, match="lists .* more than once"):
        VLLMResource(engine="server", server_urls=[two[0].url, two[0].url + "/v1"], model="m").model_identity()
    with pytest.raises(ConfigError, match=r"server_url\(s\) needs model="):
        VLLMResource(engine="server", server_urls=[two[0].url]).model_name()


VOCAB = {w: i for i, w in enumerate(["<unk>", "<s>", "user", "system", "assistant", "prompt", *"0123456789"])}


def _tokenizer_folder(path):
    """A word-level tokenizer with a chat template, saved as a model folder would have it."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>")
    fast.chat_template = ("{% for m in messages %}<s> {{ m.role }} {{ m.content }} {% endfor %}"
                          "{% if add_generation_prompt %}<s> assistant{% endif %}")
    fast.save_pretrained(path)
    return str(path)


def test_server_token_ids_send_token_ids_to_completions(tmp_path, two, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a folder that is not there must not become a hub download
    folder = _tokenizer_folder(tmp_path / "model")
    for rep in two:
        rep.root = folder  # where the server loaded the model from
    resource = VLLMResource(engine="server", server_urls=[r.url for r in two], model="m", server_token_ids=True,
                            max_in_flight=2)
    engine = resource.get_engine()
    assert isinstance(engine, VLLMServerEngine)
    res = _generate(engine, ["prompt 3", "prompt 7"])
    assert all(r.text == LABELS[0] and r.prompt_tokens == 6 for r in res.values())
    bodies = [b for rep in two for b in rep.bodies]
    assert not _answered(two) and len(bodies) == 2  # nothing went to /v1/chat/completions
    ids = {tuple(b["prompt"]) for b in bodies}
    s, user, assistant, prompt = VOCAB["<s>"], VOCAB["user"], VOCAB["assistant"], VOCAB["prompt"]
    assert ids == {(s, user, prompt, VOCAB[d], s, assistant) for d in "37"}  # the template, no added BOS
    assert all("messages" not in b and b["structured_outputs"] == {"choice": LABELS} and b["model"] == "m"
               for b in bodies)
    two[0].root = str(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="server_token_ids needs the model's tokenizer in this process"):
        _client(two[0].url, server_token_ids=True)


# --- through Dagster -------------------------------------------------------------------------------


def test_materialize_with_server_urls_labels_every_partition(tmp_path, two):
    from dagster import DagsterInstance, Definitions, materialize

    from sparkbatch_dagster import build_batch_assets
    from sparkbatch_dagster.cli.commands import RANGE_END, RANGE_START

    live, dying = two
    dying.fail_after = 3
    job = build_batch_assets(spec=make_spec(tmp_path, n=40, shards=2))
    resource = VLLMResource(engine="server", server_urls=[dying.url, live.url], model="m", max_retries=1,
                            request_timeout_s=5.0, max_in_flight=4)
    defs = Definitions(assets=job.assets, resources={"vllm": resource})
    inst = DagsterInstance.get()
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=defs.resources,
                       instance=inst).success
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    started = time.monotonic()
    assert materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources=defs.resources, instance=inst,
                       tags={RANGE_START: keys[0], RANGE_END: keys[-1]}).success
    assert time.monotonic() - started < 60
    assert len(job.done_partitions(resource)) == 2
    version = job.output_version(resource)
    rows = [r for k in keys for r in pq.read_table(job.home.labeled_path(version, k)).to_pylist()]
    assert len(rows) == 40 and all(r["output"] in LABELS for r in rows)
    one = VLLMResource(engine="server", server_url=live.url, model="m")
    assert {r["model"] for r in rows} == {one.model_identity()}  # the same identity as one server's
    assert sum(dying.answered.values()) <= 3 + 3 and sum(live.answered.values()) >= 40 - 6
