"""Declared hardware: the figures a price projection may use, and the candidates an estimate compares.

A node option's speed is either measured (the sample ran on that kind of machine) or projected
from these figures through the roofline model of ``sparkbatch_dagster.estimate.roofline``;
never another machine's measured speed at this one's price.

Presets (``NodeOption(hardware="dgx-spark")``), per GPU:

* ``dgx-spark``, NVIDIA GB10: 273 GB/s of LPDDR5x (NVIDIA's spec sheet), 128 GB unified memory
  shared by CPU and GPU (about 121.7 GiB visible to CUDA). bf16 dense tensor throughput is not
  published: NVIDIA quotes 1 PFLOP of FP4 *with sparsity*, so 500 dense FP4, 250 FP8 and 125 bf16
  if each halving of precision doubles the rate as on data-centre Blackwell. GB10 is an SM 12.x
  part like GeForce Blackwell, which runs bf16 with fp32 accumulation at half that rate: about 62.
  Declared as 125 with ``bf16_tflops_low`` 62, and a projection's slow end uses the low figure.
* ``h200``, NVIDIA H200 SXM: 4.8 TB/s of HBM3e, 141 GB, 989 TFLOPS bf16 dense (NVIDIA's spec
  sheet quotes 1,979 with sparsity).

Example::

    NodeOption(name="2x H200", hourly_usd=7.0, gpus_per_node=2, hardware="h200")
    NodeOption(name="my box", hourly_usd=2.0, hardware=HardwareSpec(name="l40s", memory_bandwidth_gbs=864,
                                                                      bf16_tflops=181, memory_gb=48))
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

#: ``NodeOption.hardware`` value for the machine the sample ran on, priced at its measured speed.
THIS_MACHINE = "this-machine"


class HardwareSpec(BaseModel):
    """One GPU's figures (a node has ``NodeOption.gpus_per_node`` of them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Kind of machine: a sample measured on this kind prices it as measured.")
    memory_bandwidth_gbs: float = Field(gt=0.0, description="Memory bandwidth, GB/s.")
    bf16_tflops: float = Field(gt=0.0, description="Dense bf16 tensor throughput, TFLOPS (no sparsity).")
    bf16_tflops_low: float | None = Field(
        default=None, gt=0.0, description="A lower figure when the declared one is uncertain: a projection's "
        "slow end uses it.",
    )
    memory_gb: float = Field(gt=0.0, description="Memory per GPU, GB (unified memory counts whole).")


PRESETS: dict[str, HardwareSpec] = {
    "dgx-spark": HardwareSpec(name="dgx-spark", memory_bandwidth_gbs=273.0, bf16_tflops=125.0,
                              bf16_tflops_low=62.0, memory_gb=128.0),
    "h200": HardwareSpec(name="h200", memory_bandwidth_gbs=4800.0, bf16_tflops=989.0, memory_gb=141.0),
}

#: What each preset is called in words (advice, chart).
PRESET_NAMES = {"dgx-spark": "DGX Spark (GB10)", "h200": "H200"}


class ModelCandidate(BaseModel):
    """A model with engine settings, compared with the others on the same sample: a precision
    is a candidate like a model. ``engine_kwargs`` merge into the job resource's; keys outside
    ``THROUGHPUT_ONLY`` (``quantization``) are part of the model identity.

    Example: ``ModelCandidate(model="/models/qwen-8b", engine_kwargs={"quantization": "fp8"})``, or
    the string ``"/models/qwen-8b@quantization=fp8"`` (``@key=value``, several joined by ``+``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1)
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    name: str | None = Field(default=None, description="How the report names it; None = the string form.")

    @property
    def label(self) -> str:
        """The name in the report: ``name``, else the string form (``model@quantization=fp8``)."""
        if self.name:
            return self.name
        extra = "+".join(f"{k}={v}" for k, v in sorted(self.engine_kwargs.items()))
        return f"{self.model}@{extra}" if extra else self.model

    @classmethod
    def parse(cls, text: str) -> ModelCandidate:
        """``"model"`` or ``"model@key=value+key2=value2"``; values are JSON where they parse
        (``max_model_len=2048`` is an int), else strings."""
        model, sep, settings = text.strip().partition("@")
        kwargs: dict[str, Any] = {}
        for item in settings.split("+") if sep else []:
            key, eq, value = item.partition("=")
            if not eq or not key.strip():
                raise ValueError(f"candidate {text!r}: {item!r} is not key=value (e.g. {model}@quantization=fp8)")
            try:
                kwargs[key.strip()] = json.loads(value)
            except ValueError:
                kwargs[key.strip()] = value.strip()
        return cls(model=model, engine_kwargs=kwargs)
