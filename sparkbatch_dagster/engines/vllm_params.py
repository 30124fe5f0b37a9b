"""vLLM ``SamplingParams`` for a job, and the one place a vLLM failure while generating becomes
an :class:`EngineError` (shared by :mod:`.vllm_offline` and :mod:`.reasoning_offline`)."""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from ..errors import EngineError
from ..spec import OutputSpec, SamplingSpec
from .base import structured_outputs


def sampling_params(sampling: SamplingSpec, output: OutputSpec | None, defaults: Mapping[str, Any] | None = None,
                    first: Collection[int] | None = None, logprobs: int | None = None,
                    max_tokens: int | None = None, **extra: Any) -> Any:
    """vLLM ``SamplingParams`` for a job, structured outputs included; ``defaults``: the model's
    own sampling defaults (:func:`.model.generation_defaults`), which a `vllm serve` applies by
    itself and ``SamplingParams`` would not; ``first``: the labels' first tokens, decoded in one
    step instead of the grammar (:mod:`.label_tokens`); ``logprobs``: top log-probabilities per
    token, for the answer's confidence (:mod:`.confidence`); ``output`` None: no grammar (a
    reasoning model's thinking); ``max_tokens`` and ``extra``: what a reasoning job sets
    (:mod:`.reasoning_offline`)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    fields = None if first or output is None else structured_outputs(output)
    structured = StructuredOutputsParams(**fields) if fields else None
    return SamplingParams(
        max_tokens=1 if first else max_tokens or sampling.max_tokens,
        allowed_token_ids=sorted(first) if first else None,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        seed=sampling.seed,
        ignore_eos=sampling.ignore_eos,
        structured_outputs=structured,
        logprobs=logprobs,
        **(defaults or {}),
        **extra,
        # Only finished requests come back from step(), as token ids: the engine skips
        # per-step incremental detokenization, and each result is decoded once here, in
        # batches. That keeps this process ahead of the GPU, so the queue never runs dry.
        output_kind=RequestOutputKind.FINAL_ONLY,
        detokenize=False,
    )


@contextlib.contextmanager
def engine_failure() -> Iterator[None]:
    """Any failure inside vLLM while generating is the engine's: an EngineError, which fails the
    run with every finished row on disk (never a vLLM exception type leaking to the caller)."""
    try:
        yield
    except Exception as exc:
        raise EngineError(f"vLLM engine failed while generating: {exc!r}") from exc
