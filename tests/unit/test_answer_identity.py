"""Issue 59: an answer's identity is what the engine receives. Property tests over both APIs'
request space (system absent, empty or set; names; tools; every sampling field; job settings;
texts holding separators, NUL and JSON): two requests whose engine inputs differ never share a
key, two whose engine inputs are equal always do. The oracle is the engine input itself, as plain
data: the messages the engine gets and the server body the plan builds (``AnswerPlan.fields``),
compared with ``==``. Mutation checks: drop any one part from the identity and hypothesis finds
two requests the engine answers differently under one key."""

from __future__ import annotations

import functools
import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, Phase, assume, find, given, settings
from hypothesis import strategies as st

from sparkbatch_dagster.engines.answers.plan import plan
from sparkbatch_dagster.engines.base import request_of
from sparkbatch_dagster.spec import OutputSpec, SamplingSpec, identity
from sparkbatch_dagster.spec.batch_prompt import request_prompt
from sparkbatch_dagster.spec.batch_requests import LineError, parse_line
from sparkbatch_dagster.spec.prompts import RenderedPrompt

JOB_OUTPUT = OutputSpec()
#: Text that once broke the key: the old key's separators, NUL, other controls, JSON of a request.
TEXT = st.one_of(
    st.text(alphabet=st.sampled_from(["a", "b", " ", "\x1d", "\x1e", "\x00", "\x1f", "\n", "é", '"', "{", "}"]),
            max_size=4),
    st.sampled_from(['{"sampling": {"n": 3}}', '\x1d{"output": null}[["system", ""]]', '[["user", "a"]]']))
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "x": {"type": "string"}}}}}
OTHER_TOOL = {"type": "function", "function": {"name": "g", "parameters": {"type": "object"}}}
#: Each sampling field a line may set, with a few values apiece (None: left out), per provider.
OPENAI_FIELDS: dict[str, list[Any]] = {
    "max_tokens": [None, 3, 4], "temperature": [None, 0, 0, 0.5, 1], "top_p": [None, 1, 0.5], "seed": [None, 1, 1, 2],
    "stop": [None, "x", ["x", "\x1e"]], "n": [None, 1, 2], "presence_penalty": [None, 0, 0.5],
    "frequency_penalty": [None, 0, -0.5], "logit_bias": [None, {"5": 1}, {"5": -1}], "logprobs": [None, False, True],
}
ANTHROPIC_FIELDS: dict[str, list[Any]] = {
    "max_tokens": [3, 4], "temperature": [None, 0, 0, 0.5, 1], "top_p": [None, 1, 0.5], "top_k": [None, 1, 5],
    "stop_sequences": [None, ["x"], ["x", "\x1d"]],
}
#: The job's settings a line falls back on (a job may set temperature, seed, top_k, max_tokens).
JOBS = [SamplingSpec(), SamplingSpec(temperature=0.7), SamplingSpec(seed=5), SamplingSpec(max_tokens=4, top_k=2),
        SamplingSpec(temperature=0, seed=None)]


@st.composite
def requests(draw: Any) -> tuple[str, dict[str, Any], int]:
    """(provider, a request line's body, the job's index in JOBS)."""
    provider = draw(st.sampled_from(["openai_batch", "anthropic_batch"]))
    system = draw(st.sampled_from([None, "", "S", "\x1d"]) | TEXT)
    turns = draw(st.lists(st.tuples(TEXT, st.sampled_from([None, "ann", "bob"])), min_size=1, max_size=3))
    messages: list[dict[str, Any]] = []
    for i, (text, name) in enumerate(turns):
        role = "user" if (len(turns) - 1 - i) % 2 == 0 else "assistant"
        turn: dict[str, Any] = {"role": role, "content": text if text.strip() else "t" + text}
        if name is not None:
            turn["name"] = name
        messages.append(turn)
    fields = OPENAI_FIELDS if provider == "openai_batch" else ANTHROPIC_FIELDS
    body: dict[str, Any] = {k: v for k, values in fields.items() if (v := draw(st.sampled_from(values))) is not None}
    if body.get("logprobs"):
        body["top_logprobs"] = draw(st.sampled_from([0, 2]))
    if provider == "openai_batch":
        if system is not None:
            messages.insert(0, {"role": draw(st.sampled_from(["system", "developer"])), "content": system})
        body["response_format"] = draw(st.sampled_from([None, {"type": "json_object"}, {"type": "json_schema",
                                       "json_schema": {"schema": {"type": "object", "required": ["a"]}}}]))
        tools = draw(st.sampled_from([None, None, None, None, [TOOL], [TOOL, OTHER_TOOL]]))
        if tools and body["response_format"] is None:
            body.update(tools=tools, tool_choice=draw(st.sampled_from(["required", "none"])))
    elif system is not None:
        body["system"] = system
    body["messages"] = messages
    return provider, {k: v for k, v in body.items() if v is not None}, draw(st.integers(0, len(JOBS) - 1))


def parsed(req: tuple[str, dict[str, Any], int]) -> tuple[Any, SamplingSpec]:
    """The run's prompt of a request (None: the line is refused), and its job's sampling."""
    return _parsed(json.dumps(req))


@functools.lru_cache(maxsize=4096)
def _parsed(req_json: str) -> tuple[Any, SamplingSpec]:
    provider, body, job_at = json.loads(req_json)
    job = JOBS[job_at]
    line = {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": body} \
        if provider == "openai_batch" else {"custom_id": "c", "params": body}
    try:
        staged = parse_line(line, provider, job).request.to_text()
    except LineError:
        return None, job
    return request_prompt(staged, job), job


def engine_input(prompt: Any, job: SamplingSpec) -> dict[str, Any]:
    """The oracle: what the engine is sent, as plain data (the server body the plan builds, the
    messages and tools as the request carries them)."""
    req = request_of("r", prompt)
    answers = plan(None, job, JOB_OUTPUT, server=True)  # the job's plan, as a run's generate call makes it
    body = answers.fields(req, "own" if answers.own(req) else "grammar", completions=False)
    tools = msgspec.to_builtins(req.tools) if req.tools is not None else None
    return {"messages": req.messages, "tools": tools, "body": body}


def oracle(req: tuple[str, dict[str, Any], int]) -> dict[str, Any]:
    return _oracle(json.dumps(req))


@functools.lru_cache(maxsize=4096)
def _oracle(req_json: str) -> dict[str, Any]:
    return engine_input(*_parsed(req_json))


def key_of(prompt: Any, job: SamplingSpec) -> str | None:
    return prompt.answer_key(job, JOB_OUTPUT)


def wrong(pair: tuple[Any, Any]) -> bool:
    """Whether the identity gets this pair wrong: a shared key for different engine inputs, two
    keys for one engine input, or a key for a draw (or none for an answer the seed fixes)."""
    (a, job_a), (b, job_b) = parsed(pair[0]), parsed(pair[1])
    if a is None or b is None:
        return False
    ka, kb = key_of(a, job_a), key_of(b, job_b)
    ia, ib = oracle(pair[0]), oracle(pair[1])
    draws = [i["body"]["temperature"] > 0 and i["body"].get("seed") is None for i in (ia, ib)]
    if [ka is None, kb is None] != draws:
        return True
    if ka is None or kb is None:
        return False
    return (ka == kb) != (ia == ib)


EDITS = ("system absent", "system empty", "system set", "developer", "name", "no name", "role", "text parts",
         "max_completion_tokens", "stop list", "field", "field gone", "warm", "response_format", "tools", "job")


def edited(draw: Any, req: tuple[str, dict[str, Any], int], edit: str) -> tuple[str, dict[str, Any], int]:
    """``req`` with one small change: to its engine input, or only to its spelling (``field:<name>``:
    that sampling field redrawn)."""
    provider, body, job = req
    body = {**body, "messages": [dict(m) for m in body["messages"]]}
    first, last = body["messages"][0], body["messages"][-1]
    has_system = first["role"] in ("system", "developer")
    if edit.startswith("system") and provider == "anthropic_batch":
        body.pop("system", None)
        if edit != "system absent":
            body["system"] = "" if edit == "system empty" else draw(TEXT)
    elif edit.startswith("system"):
        if has_system:
            body["messages"].pop(0)
        if edit != "system absent":
            body["messages"].insert(0, {"role": "system", "content": "" if edit == "system empty" else draw(TEXT)})
    elif edit == "developer" and has_system:
        first["role"] = "developer" if first["role"] == "system" else "system"
    elif edit == "name":
        last["name"] = draw(st.sampled_from(["ann", "bob", ""]))
    elif edit == "no name":
        last.pop("name", None)
    elif edit == "role" and len(body["messages"]) > 1:
        one = body["messages"][-2]
        one["role"] = draw(st.sampled_from(["user", "assistant"] + (["system"] if provider == "openai_batch" else [])))
    elif edit == "text parts":
        last["content"] = [{"type": "text", "text": last["content"]}]
    elif edit == "max_completion_tokens" and provider == "openai_batch" and "max_tokens" in body:
        body["max_completion_tokens"] = body.pop("max_tokens")
    elif edit == "stop list" and isinstance(body.get("stop"), str):
        body["stop"] = [body["stop"]]
    elif edit.startswith("field"):
        fields = OPENAI_FIELDS if provider == "openai_batch" else ANTHROPIC_FIELDS
        name = edit.partition(":")[2] or draw(st.sampled_from(sorted(fields)))
        if name not in fields:
            return provider, body, job
        body.pop(name, None)
        body.pop("top_logprobs", None) if name == "logprobs" else None
        value = draw(st.sampled_from(fields[name])) if edit == "field" else None
        if value is not None:
            body[name] = value
        if body.get("logprobs"):
            body["top_logprobs"] = draw(st.sampled_from([0, 2]))
    elif edit == "warm":  # sampled, and seeded: reusable, and named by its temperature
        body["temperature"] = draw(st.sampled_from([0.5, 1]))
        if provider == "openai_batch":
            body["seed"] = 1
        else:
            job = 2
    elif edit == "response_format" and provider == "openai_batch" and "tools" not in body:
        body["response_format"] = draw(st.sampled_from([{"type": "json_object"}, {"type": "text"}, {
            "type": "json_schema", "json_schema": {"schema": {"type": "object", "required": ["b"]}}}]))
    elif edit == "tools" and provider == "openai_batch" and "response_format" not in body:
        body.update(tools=draw(st.sampled_from([[TOOL], [OTHER_TOOL, TOOL]])),
                    tool_choice=draw(st.sampled_from(["required", "none"])))
    elif edit == "job":
        job = draw(st.integers(0, len(JOBS) - 1))
    return provider, body, job


@st.composite
def pairs(draw: Any, focus: tuple[str, ...] = ()) -> tuple[Any, Any]:
    """Two requests close enough to matter: the same, one small change (one to three), or two
    drawn apart. ``focus``: edits drawn half the time (a mutation check's part)."""
    first = draw(requests())
    how = draw(st.sampled_from(["same", "edit", "edit", "edit", "apart"]))
    if how == "same":
        return first, first
    if how == "apart":
        return first, draw(requests())
    other = first
    for _ in range(draw(st.integers(1, 3))):
        edit = draw(st.sampled_from(focus)) if focus and draw(st.booleans()) else draw(st.sampled_from(EDITS))
        other = edited(draw, other, edit)
    return first, other


COUNTED = {"pairs": 0, "same_input": 0, "draws": 0}


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pairs())
def test_two_requests_share_a_key_exactly_when_the_engine_gets_the_same_input(pair: tuple[Any, Any]) -> None:
    (a, job_a), (b, job_b) = parsed(pair[0]), parsed(pair[1])
    assume(a is not None and b is not None)
    COUNTED["pairs"] += 1
    ia, ib = engine_input(a, job_a), engine_input(b, job_b)
    COUNTED["same_input"] += ia == ib
    COUNTED["draws"] += key_of(a, job_a) is None
    assert not wrong(pair), (ia, ib)


#: One part dropped from the identity at a time, and how (the identity's own fields, or its input).
#: Each mutation: how it drops its part, and the edits that reach it (drawn half the time).
Mutation = tuple[Any, tuple[str, ...]]


def _drop_field(name: str) -> Mutation:
    wanted = {"stop": "stop_sequences"}.get(name, name)
    return (lambda mp: mp.setattr(identity, "_IDENTITY", tuple(f for f in identity._IDENTITY if f != name)),
            ("warm", f"field:{name}", f"field:{wanted}", "job"))


def _drop_input(change: Any, *focus: str) -> Mutation:
    original = identity.engine_input
    return (lambda mp: mp.setattr(identity, "engine_input", lambda m, t, s, o: original(*change(m, t, s, o))),
            focus)


MUTATIONS: dict[str, Mutation] = {
    **{f"sampling.{name}": _drop_field(name) for name in identity._IDENTITY if name not in ("ignore_eos", "reasoning")},
    "message names": _drop_input(lambda m, t, s, o: ([{k: v for k, v in x.items() if k != "name"} for x in m], t, s,
                                                     o), "name", "no name"),
    "an empty system message": _drop_input(lambda m, t, s, o: ([x for x in m if x != {"role": "system", "content": ""}],
                                                               t, s, o), "system empty", "system absent"),
    "roles": _drop_input(lambda m, t, s, o: ([{**x, "role": "user"} for x in m], t, s, o), "role"),
    "tools": _drop_input(lambda m, t, s, o: (m, None, s, o), "tools"),
    "output": _drop_input(lambda m, t, s, o: (m, t, s, JOB_OUTPUT), "response_format"),
}


@pytest.mark.parametrize("dropped", sorted(MUTATIONS))
def test_dropping_any_part_from_the_identity_is_caught(dropped: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutation check: with ``dropped`` left out of the key, hypothesis finds a pair of
    requests the engine answers differently that would share one answer."""
    drop, focus = MUTATIONS[dropped]
    drop(monkeypatch)
    tried = [0]

    def caught(pair: tuple[Any, Any]) -> bool:
        tried[0] += 1
        return wrong(pair)

    # The first counterexample is enough (no shrinking): it is printed, with how many pairs it took.
    found = find(pairs(focus), caught, settings=settings(max_examples=20_000, deadline=None, database=None,
                                                    phases=[Phase.generate], suppress_health_check=list(HealthCheck)))
    print(f"{dropped}: caught after {tried[0]} pairs")
    assert wrong(found)


def test_the_column_path_and_a_plain_line_share_a_key_and_an_empty_system_does_not() -> None:
    job = SamplingSpec()
    plain = RenderedPrompt("", "U")
    assert plain.messages() == [{"role": "user", "content": "U"}]  # no system prompt: no system message
    line = {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "U"}], "temperature": 0}}
    empty = {**line, "body": {**line["body"],
                              "messages": [{"role": "system", "content": ""}, *line["body"]["messages"]]}}
    keys = [request_prompt(parse_line(x, "openai_batch", job).request.to_text(), job).answer_key(job, JOB_OUTPUT)
            for x in (line, empty)]
    assert keys[0] == plain.answer_key(job, JOB_OUTPUT) and keys[1] != keys[0]
    claude = parse_line({"custom_id": "c", "params": {"max_tokens": 64, "system": "", "temperature": 0,
                                                      "messages": [{"role": "user", "content": "U"}]}},
                        "anthropic_batch", job)
    assert request_prompt(claude.request.to_text(), job).answer_key(job, JOB_OUTPUT) == keys[1]


def test_a_planted_separator_cannot_take_another_requests_key() -> None:
    """Issue 59's attack: a system text of the old separator plus another request's settings JSON."""
    job = SamplingSpec()
    target = RenderedPrompt("S", "U").answer_key(SamplingSpec(n=3), JOB_OUTPUT)
    planted = RenderedPrompt('\x1d{"output": null, "sampling": {"n": 3}}[["system", "S"]]', "U")
    assert planted.answer_key(job, JOB_OUTPUT) != target
