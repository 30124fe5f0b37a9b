"""Projected generation time on declared hardware: a roofline model that splits prefill and decode.

The sample gives counts that do not depend on the machine: prompt and output tokens per request,
the requests the job still has to generate, and the batch (``max_num_seqs`` sequences at once).
The model gives its size: parameters (``config.json``) and bytes per parameter (the dtype, or
the quantization: fp8 is 1 byte, 4-bit schemes half of one), and KV-cache bytes per token.
Per engine of ``gpus`` GPUs (their figures add up; tensor-parallel communication is not counted):

* prefill is compute-bound: ``2 x params`` FLOPs per prompt token not served from the prefix
  cache, at the bf16 peak (attention FLOPs, a few percent at a few hundred tokens, are left out);
* decode is bandwidth-bound while the batch is small: each step reads the weights once plus the
  KV cache of every running sequence, and computes ``2 x params`` FLOPs per sequence; the step
  takes the longer of the two. ``steps = output tokens / concurrent sequences``, where the
  concurrency is ``max_num_seqs``, fewer when the job has fewer requests or the KV cache (90%
  of memory less the weights) holds fewer sequences of this length.

That is the time at 100% of peak. vLLM reaches part of it, so a projection is a range:
``[peak / EFFICIENCY[1], peak / EFFICIENCY[0]]``, the slow end with the hardware's low bf16
figure where its declared one is uncertain (the DGX Spark's). The range's slow end is the number
the estimate prices and chooses on: a rented box is paid for the hours it takes, and a choice
that holds at the slow end holds at the fast end too. ``benchmarks/engine/roofline_check.py`` checks the
model against H200 measurements (``benchmarks/results/roofline-h200.json``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..engines.platform.model import model_config, param_count, weight_file_bytes
from ..spec import HardwareSpec
from .records import Projected

#: Share of the peak (compute for prefill, bandwidth for decode) vLLM reaches: (slow end, fast end).
EFFICIENCY = (0.3, 0.8)
#: Share of a GPU's memory the engine takes (gpu_memory_utilization's GPU default); KV cache = that less weights.
MEMORY_SHARE = 0.9
#: Bytes per parameter of the weights under an online or checkpoint quantization.
QUANT_BYTES = {"fp8": 1.0, "fbgemm_fp8": 1.0, "ptpc_fp8": 1.0, "modelopt": 1.0,
               "experts_int8": 1.0, "awq": 0.5, "gptq": 0.5, "awq_marlin": 0.5, "gptq_marlin": 0.5,
               "bitsandbytes": 0.5, "modelopt_fp4": 0.5, "nvfp4": 0.5, "mxfp4": 0.5, "gguf": 0.5}
_DTYPE_BYTES = {"float32": 4.0, "float": 4.0, "float16": 2.0, "half": 2.0, "bfloat16": 2.0}


@dataclass(frozen=True)
class ModelShape:
    """What the roofline needs of a model: its size, the bytes of a parameter, the KV bytes per token."""

    params: float
    bytes_per_param: float
    kv_bytes_per_token: float

    @property
    def weights_gb(self) -> float:
        return self.params * self.bytes_per_param / 1e9


@dataclass(frozen=True)
class Workload:
    """The counts a projection starts from (totals over the prompts one engine generates)."""

    requests: float
    prompt_tokens: float
    output_tokens: float
    concurrency: int  # max_num_seqs
    cached_share: float = 0.0  # share of prompt tokens served by the prefix cache (0: unknown, all computed)


@dataclass(frozen=True)
class Projection:
    """A projected range of generation seconds, and the peak-rate parts it came from."""

    low_s: float
    high_s: float
    prefill_s: float  # at the declared peak, 100% efficiency
    decode_s: float
    concurrency: int

    def rounded(self) -> Projected:
        """The figures a priced option carries (the report's ``projection``)."""
        return Projected(low_s=round(self.low_s, 2), high_s=round(self.high_s, 2),
                         prefill_peak_s=round(self.prefill_s, 3), decode_peak_s=round(self.decode_s, 3),
                         concurrency=self.concurrency)


def model_shape(resolved: str, engine_kwargs: dict[str, Any] | None = None, dtype: str = "auto") -> ModelShape | None:
    """A model folder's shape, with the bytes per parameter its precision gives (``quantization``
    in ``engine_kwargs``; else the weight files' bytes per parameter; else ``dtype``, bf16 by
    default). None without a readable ``config.json``."""
    cfg = model_config(resolved)
    params = param_count(cfg) if cfg is not None else None
    if cfg is None or not params:
        return None
    kwargs = engine_kwargs or {}
    files = weight_file_bytes(resolved)
    if kwargs.get("quantization") in QUANT_BYTES:
        per_param = QUANT_BYTES[kwargs["quantization"]]
    elif files:
        per_param = files / params
    else:
        per_param = _DTYPE_BYTES.get(dtype if dtype != "auto" else str(cfg.get("torch_dtype", "bfloat16")), 2.0)
    heads = int(cfg.get("num_attention_heads") or 1)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    kv_dtype = 1.0 if str(kwargs.get("kv_cache_dtype", "")).startswith("fp8") else 2.0
    return ModelShape(float(params), per_param, 2 * int(cfg["num_hidden_layers"]) * kv_heads * head_dim * kv_dtype)


def peak_seconds(work: Workload, shape: ModelShape, hw: HardwareSpec, gpus: int = 1,
                 tflops: float | None = None) -> tuple[float, float, int]:
    """(prefill seconds, decode seconds, concurrent sequences) at 100% of ``hw``'s peak."""
    flops = (tflops or hw.bf16_tflops) * 1e12 * gpus
    bandwidth = hw.memory_bandwidth_gbs * 1e9 * gpus
    prefill = 2 * shape.params * work.prompt_tokens * (1 - work.cached_share) / flops
    if work.output_tokens <= 0 or work.requests <= 0:
        return prefill, 0.0, 0
    prompt, out = work.prompt_tokens / work.requests, work.output_tokens / work.requests
    kv_room = hw.memory_gb * 1e9 * gpus * MEMORY_SHARE - shape.params * shape.bytes_per_param
    held = kv_room / (shape.kv_bytes_per_token * (prompt + out)) if shape.kv_bytes_per_token else math.inf
    concurrency = max(1, int(min(work.concurrency, math.ceil(work.requests), held)))
    context = prompt + out / 2  # a sequence's mean KV length while it decodes
    read = shape.params * shape.bytes_per_param + concurrency * context * shape.kv_bytes_per_token
    step = max(read / bandwidth, 2 * shape.params * concurrency / flops)
    return prefill, work.output_tokens / concurrency * step, concurrency


def project(work: Workload, shape: ModelShape, hw: HardwareSpec, gpus: int = 1) -> Projection:
    """Generation seconds of ``work`` on one engine of ``gpus`` GPUs of ``hw``, as a range.

    Example: 1,000 requests of 200 prompt and 8 output tokens, a 1B model in bf16, one H200::

        project(Workload(1000, 200_000, 8_000, 1024), ModelShape(1e9, 2.0, 32768), PRESETS["h200"])
    """
    prefill, decode, concurrency = peak_seconds(work, shape, hw, gpus)
    slow_prefill, slow_decode, _ = peak_seconds(work, shape, hw, gpus, hw.bf16_tflops_low or hw.bf16_tflops)
    fast, slow = EFFICIENCY[1], EFFICIENCY[0]
    return Projection((prefill + decode) / fast, (slow_prefill + slow_decode) / slow, prefill, decode, concurrency)
