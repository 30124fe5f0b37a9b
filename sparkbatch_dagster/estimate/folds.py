"""Seeded k-fold splits for calibration, the review budget and cascades, in plain numpy.

They are scikit-learn's ``KFold(folds, shuffle=True, random_state=seed).split`` and
``StratifiedKFold(...).split`` re-done: the same index arrays in the same order for the same seed
(``tests/unit/test_folds_oracle.py`` holds them to scikit-learn). Importing scikit-learn costs a run
about two CPU seconds, for a few lines of arithmetic; identical folds keep every figure the
estimate and the analytics asset reported before (held-out scores, the chosen method) as it was.

Example::

    for train, test in stratified_kfold(correct, folds=5, seed=0):
        fit(c[train], y[train]).apply(c[test])
"""

from __future__ import annotations

import warnings

import numpy as np
from numpy.typing import ArrayLike, NDArray

Split = tuple[NDArray[np.intp], NDArray[np.intp]]

__all__ = ["Split", "kfold", "stratified_kfold"]


def _check(rows: int, folds: int) -> None:
    # scikit-learn's own checks and messages (ValueError), so a caller sees what it saw before.
    if folds <= 1:
        raise ValueError(f"k-fold cross-validation requires at least one train/test split by setting n_splits=2 "
                         f"or more, got n_splits={folds}.")
    if folds > rows:
        raise ValueError(f"Cannot have number of splits n_splits={folds} greater than the number of samples: "
                         f"n_samples={rows}.")


def _splits(test_folds: NDArray[np.int_], folds: int) -> list[Split]:
    # Through a mask, as scikit-learn does: train and test come out in row order, not shuffled order.
    rows = np.arange(test_folds.size)
    return [(rows[test_folds != k], rows[test_folds == k]) for k in range(folds)]


def kfold(rows: int, folds: int, seed: int) -> list[Split]:
    """(train, test) row positions of ``folds`` folds of ``rows`` rows, shuffled by ``seed``: the
    first ``rows % folds`` folds one row larger."""
    _check(rows, folds)
    shuffled = np.arange(rows)
    np.random.RandomState(seed).shuffle(shuffled)
    sizes = np.full(folds, rows // folds, dtype=int)
    sizes[:rows % folds] += 1
    test_folds = np.empty(rows, dtype=int)
    test_folds[shuffled] = np.arange(folds).repeat(sizes)
    return _splits(test_folds, folds)


def stratified_kfold(labels: ArrayLike, folds: int, seed: int) -> list[Split]:
    """(train, test) row positions of ``folds`` folds, each class of ``labels`` spread over them as
    evenly as it goes (a class's rows dealt round-robin by count, then shuffled per class by
    ``seed``). ``labels`` are class labels (bool, int, str), never continuous values.

    A class with fewer rows than folds leaves some folds without it (a UserWarning, as scikit-learn
    gives); every class that small is a ValueError."""
    y = np.asarray(labels).ravel()
    _check(y.size, folds)
    _, first, inverse = np.unique(y, return_index=True, return_inverse=True)
    # Classes numbered by first appearance, not by value: which class is shuffled first (and so
    # which draws of the seeded generator it gets) follows the rows, as in scikit-learn.
    _, by_appearance = np.unique(first, return_inverse=True)
    encoded = by_appearance[inverse.ravel()]
    classes = first.size
    counts = np.bincount(encoded, minlength=classes)
    if np.all(folds > counts):
        raise ValueError(f"n_splits={folds} cannot be greater than the number of members in each class.")
    if folds > counts.min():
        warnings.warn(f"The least populated class in y has only {counts.min()} members, which is less than "
                      f"n_splits={folds}.", UserWarning, stacklevel=2)
    ordered = np.sort(encoded)
    allocation = np.asarray([np.bincount(ordered[k::folds], minlength=classes) for k in range(folds)])
    rng = np.random.RandomState(seed)
    test_folds = np.empty(y.size, dtype=int)
    for k in range(classes):
        dealt = np.arange(folds).repeat(allocation[:, k])
        rng.shuffle(dealt)
        test_folds[encoded == k] = dealt
    return _splits(test_folds, folds)
