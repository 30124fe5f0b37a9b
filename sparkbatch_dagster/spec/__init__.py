"""The job spec: what a job is, validated before anything runs.

Modules:

- :mod:`.job_spec`: :class:`JobSpec`, the job as one validated value;
- :mod:`.answer`: :class:`OutputSpec` (label, json or text answers) and :class:`SamplingSpec`;
- :mod:`.estimate_spec`: :class:`EstimateSpec` and :class:`NodeOption`, the estimate's settings and rented boxes;
- :mod:`.hardware`: declared hardware (presets, :class:`HardwareSpec`) and the candidate models compared;
- :mod:`.hosted`: the user's hosted batch price table, :class:`HostedPrice`;
- :mod:`.sink`: the table sink's settings, :class:`SinkSpec`;
- :mod:`.cascade`: a cascade's stages, :class:`CascadeStage`;
- :mod:`.review`: how many rows a person reviews, :class:`ReviewSpec` (a row budget or an error target);
- :mod:`.checked`: settings errors and the fingerprints that name outputs (:func:`fingerprint`);
- :mod:`.prompts`: sandboxed Jinja over each row, and the per-row text checks that make bad input error rows;
- :mod:`.batch_requests`: a provider batch file's request line, checked and normalized;
- :mod:`.batch_prompt`: a staged request read back as the run's prompt;
- :mod:`.request_fields`: every sampling field of a request declared once (names, type, identity), and the one merge;
- :mod:`.identity`: an answer's identity, what the engine receives, hashed (a draw has none);
- :mod:`.batch_tools`: a batch line's tools and tool choice, checked, and a forced call's JSON schema.

May import: ``errors``. The bottom room: everything else builds on it.
"""

from .answer import OutputSpec, SamplingSpec
from .cascade import CascadeStage
from .checked import fingerprint
from .estimate_spec import EstimateSpec, NodeOption
from .hardware import PRESETS, THIS_MACHINE, HardwareSpec, ModelCandidate
from .hosted import HostedPrice, load_hosted_prices
from .job_spec import BATCH_INPUTS, JobSpec
from .review import ReviewSpec
from .sink import SinkSpec

__all__ = ["BATCH_INPUTS", "PRESETS", "THIS_MACHINE", "CascadeStage", "EstimateSpec", "HardwareSpec", "HostedPrice",
           "JobSpec", "ModelCandidate", "NodeOption", "OutputSpec", "ReviewSpec", "SamplingSpec", "SinkSpec",
           "fingerprint", "load_hosted_prices"]
