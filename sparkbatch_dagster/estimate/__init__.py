"""The estimate: know the bill before paying it.

Modules:

- :mod:`.sample`: the timed sample, drawn from the job's own shards and timed on the real engine;
- :mod:`.forecast`: the whole job's time and cost, and the report;
- :mod:`.records`: the estimate's typed records: its prediction and each option, as they leave the room;
- :mod:`.review_records`: the records of a model's confidence: calibration, review budget, review plan;
- :mod:`.record_base`: the records' base, a frozen Struct with its dict form;
- :mod:`.pricing`: each node option's price and where its speed comes from;
- :mod:`.machine`: which kind of machine the sample ran on, and which candidates it can run;
- :mod:`.roofline`: projected generation time on declared hardware;
- :mod:`.choice`: accuracy intervals and the best buy;
- :mod:`.cascades`: cascades judged on the sample: which pair and threshold clears the bar cheapest;
- :mod:`.calibration`: label confidences calibrated on the gold rows (chosen by cross-validation), ECE and Brier;
- :mod:`.folds`: seeded k-fold and stratified k-fold splits (scikit-learn's, in numpy);
- :mod:`.isotonic`: the isotonic calibration map's fit (scikit-learn's, without it);
- :mod:`.review_budget`: a review budget or error target turned into a threshold, from the gold rows;
- :mod:`.review_chart`: the reliability diagram and the review-budget curve as a chart;
- :mod:`.review_figures`: each model's calibration, review budget and review plan in the estimate;
- :mod:`.gold_fit`: calibration and the review threshold learnt from a finished version's gold rows;
- :mod:`.placement`: how a node option runs a model;
- :mod:`.chart`: the chart.

Knows nothing of Dagster.

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
