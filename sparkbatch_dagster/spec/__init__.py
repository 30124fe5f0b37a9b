"""The job spec: what a job is, validated before anything runs.

Owns :class:`JobSpec` (:mod:`.job_spec`) and its parts: :class:`OutputSpec` and
:class:`SamplingSpec` (:mod:`.answer`), :class:`EstimateSpec` and :class:`NodeOption`
(:mod:`.estimate_spec`), the user's hosted batch prices :class:`HostedPrice` (:mod:`.hosted`),
the table sink (:mod:`.sink`), a cascade's stages (:mod:`.cascade`); the fingerprints that name
outputs (:func:`fingerprint`, :mod:`.checked`); the prompt templates: sandboxed Jinja over each
row and the per-row text checks that turn bad input into error rows (:mod:`.prompts`); and
provider batch-file request lines, each row its own prompt (:mod:`.batch_requests`).

May import: ``errors``. The bottom room: everything else builds on it.
"""

from .answer import OutputSpec, SamplingSpec
from .cascade import CascadeStage
from .checked import fingerprint
from .estimate_spec import EstimateSpec, NodeOption
from .hardware import PRESETS, THIS_MACHINE, HardwareSpec, ModelCandidate
from .hosted import HostedPrice, load_hosted_prices
from .job_spec import BATCH_INPUTS, JobSpec
from .sink import SinkSpec

__all__ = ["BATCH_INPUTS", "PRESETS", "THIS_MACHINE", "CascadeStage", "EstimateSpec", "HardwareSpec", "HostedPrice",
           "JobSpec", "ModelCandidate", "NodeOption", "OutputSpec", "SamplingSpec", "SinkSpec", "fingerprint",
           "load_hosted_prices"]
