"""The job spec: what a job is, validated before anything runs.

Owns :class:`JobSpec` and its parts (:class:`OutputSpec`, :class:`SamplingSpec`,
:class:`EstimateSpec`, :class:`NodeOption`, the user's hosted batch prices :class:`HostedPrice`,
:mod:`.hosted`), the fingerprints that name outputs
(:func:`fingerprint`), and the prompt templates: sandboxed Jinja over each row and the per-row
text checks that turn bad input into error rows (:mod:`.prompts`).

May import: ``errors``. The bottom room: everything else builds on it.
"""

from .cascade import CascadeStage
from .hardware import PRESETS, THIS_MACHINE, HardwareSpec, ModelCandidate
from .hosted import HostedPrice, load_hosted_prices
from .job_spec import EstimateSpec, JobSpec, NodeOption, OutputSpec, SamplingSpec, fingerprint
from .sink import SinkSpec

__all__ = ["PRESETS", "THIS_MACHINE", "CascadeStage", "EstimateSpec", "HardwareSpec", "HostedPrice", "JobSpec",
           "ModelCandidate", "NodeOption", "OutputSpec", "SamplingSpec", "SinkSpec", "fingerprint",
           "load_hosted_prices"]
