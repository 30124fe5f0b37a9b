"""The plain vLLM scripts the pipeline is measured against, on an engine ``workload.set_up``
started: ``LLM.chat`` over every row (what a vLLM user writes), and ``LLM.generate`` over token ids
rendered and encoded in one batch (the fastest plain script). Each returns its seconds and the
tokens it processed."""

from __future__ import annotations

import time
from typing import Any

from benchmarks.lib.workload import conversations
from sparkbatch_dagster import JobSpec


def raw_generate(engine: Any, spec: JobSpec, rows: list[dict[str, Any]]) -> tuple[float, int]:
    """What a plain vLLM user writes: render every row, one LLM.chat call."""
    from sparkbatch_dagster.engines.answers.plan import sampling_params

    convs = conversations(spec, rows)
    params = sampling_params(spec.sampling, spec.output)
    started = time.perf_counter()
    outs = engine._llm.chat(convs, params, use_tqdm=False)
    seconds = time.perf_counter() - started
    return seconds, sum(len(o.prompt_token_ids) + len(o.outputs[0].token_ids) for o in outs)


def token_prompts(tokenizer: Any, convs: list[list[dict[str, str]]]) -> list[Any]:
    """Every conversation through the chat template, then one batch encode (no special tokens
    added: the template has them, as ``LLM.chat`` renders it), as ``TokensPrompt``s."""
    from vllm.inputs import TokensPrompt

    texts = tokenizer.apply_chat_template(convs, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    return [TokensPrompt(prompt_token_ids=list(x)) for x in ids]


def raw_generate_tokens(engine: Any, spec: JobSpec, rows: list[dict[str, Any]]) -> tuple[float, int]:
    """The fastest plain vLLM script: the chat template over every row and one batch encode, then
    one LLM.generate call over token ids (template and tokenizer timed, as in ``LLM.chat``)."""
    from sparkbatch_dagster.engines.answers.plan import sampling_params

    convs = conversations(spec, rows)
    params = sampling_params(spec.sampling, spec.output)
    tokenizer = engine._llm.get_tokenizer()
    started = time.perf_counter()
    outs = engine._llm.generate(token_prompts(tokenizer, convs), params, use_tqdm=False)
    seconds = time.perf_counter() - started
    return seconds, sum(len(o.prompt_token_ids) + len(o.outputs[0].token_ids) for o in outs)
