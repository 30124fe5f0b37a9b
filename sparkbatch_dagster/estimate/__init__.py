"""The estimate: know the bill before paying it.

Owns the timed sample (:mod:`.sample`: drawn from the job's own shards, timed on the real engine,
grown while a model's accuracy is undecided), the extrapolation to the whole job and its report
(:mod:`.forecast`), the accuracy intervals and the best buy (:mod:`.choice`), how a node option
runs a model (:mod:`.placement`) and the chart (:mod:`.chart`). Knows nothing of Dagster.

May import: ``errors``, ``spec``, ``home``, ``inputs``, ``engines``, ``run``.
"""

from .forecast import predict, write_report
from .sample import (
    EXACT_STORE_COUNT_ROWS,
    Sample,
    Stored,
    Timing,
    count_stored,
    draw_sample,
    merge,
    sample_model,
    time_rows,
    time_sample,
)

__all__ = ["EXACT_STORE_COUNT_ROWS", "Sample", "Stored", "Timing", "count_stored", "draw_sample", "merge", "predict",
           "sample_model", "time_rows", "time_sample", "write_report"]
