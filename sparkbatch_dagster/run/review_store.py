"""A writer's repair of what the review keeps in the home: the calibrations, the review threshold and
the reviewers' labels (``docs/failures.md``, "Damaged review files").

Readers leave a damaged file out, with one warning line, and go on (:mod:`.calibration_map`,
:mod:`.review_queue`, :mod:`.human_labels`); the commands and assets that write the home
(``sparkbatch run``, the analytics and review assets, an import) call :func:`heal` after the cache is
refreshed, which sets it aside for good:

- a calibration or threshold is derived data: kept as ``<name>.broken-<time>`` (in the bucket too,
  when the bucket's copy is the damaged one) and written again by the next analytics from the gold
  rows; until then the confidences are the model's own and the review uses no stored plan;
- a label file is the reviewers' work: a damaged cache copy comes again from the bucket, a damaged
  bucket copy is replaced by a box's whole one, and only when no whole copy is left is it set aside,
  kept, and its loss reported (:func:`.human_labels.heal`).

Example::

    home.pull_review()
    heal(home)     # then Marks.of / the views read only whole files
"""

from __future__ import annotations

from pathlib import Path

from ..home import JobHome
from ..home.review_files import set_aside, set_aside_object
from . import calibration_map, human_labels
from .review_queue import read_threshold, threshold_path


def heal(home: JobHome) -> None:
    """Set aside every damaged calibration and threshold file (here, and in a bucket home's bucket
    when its copy is the same damaged bytes), and repair the label store (:func:`.human_labels.heal`)."""
    for path, why in calibration_map.damaged(home.calibration_dir):
        _set_aside(home, path, why, "its model's confidences are its raw ones until analytics fits the calibration "
                                    "again from the gold rows")
    path = threshold_path(home)
    plan = read_threshold(path) if path.exists() else None
    if isinstance(plan, str):
        _set_aside(home, path, plan, "the review goes on as if no plan were stored until analytics writes it again "
                                    "from the gold rows")
    human_labels.heal(home)


def _set_aside(home: JobHome, path: Path, why: str, then: str) -> None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:  # set aside by another process of this box
        return
    if home.remote is not None:
        set_aside_object(home.remote.bucket, home.remote.rel(path), only_if=raw)
    set_aside(path, why, then)
