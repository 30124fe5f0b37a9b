"""The folds and the isotonic fit re-done without scikit-learn (``estimate/folds.py``,
``estimate/isotonic.py``) held to scikit-learn itself, the oracle: for any rows, labels and seed,
the same (train, test) index arrays in the same order and dtype, the same errors and warnings;
for any confidences and right/wrong values, the same isotonic points to the bit. Identical folds
and points are what keep every calibration figure, chosen method and review plan as it was.

scikit-learn is imported here only (it is a dev dependency, not the product's). Hypothesis picks
the shapes, with the edges named as examples: as many rows as folds, classes smaller than the
folds, one class, tied and nearly tied confidences, constant answers, 0 and 1."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sparkbatch_dagster.estimate import calibration as cal
from sparkbatch_dagster.estimate.folds import kfold, stratified_kfold
from sparkbatch_dagster.estimate.isotonic import isotonic_points

EXAMPLES = settings(max_examples=400, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
SEEDS = st.integers(0, 2**32 - 1)


def outcome(make: Callable[[], Iterable[Any]]) -> tuple[str, list[Any], list[str]]:
    """What a splitter does: ('ok', its splits, warnings) or ('ValueError: message', [], warnings)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            got, done = list(make()), "ok"
        except ValueError as exc:
            got, done = [], f"ValueError: {exc}"
    return done, got, [f"{w.category.__name__}: {w.message}" for w in caught]


def assert_same(ours: tuple[str, list[Any], list[str]], theirs: tuple[str, list[Any], list[str]]) -> None:
    assert ours[0] == theirs[0] and ours[2] == theirs[2]
    assert len(ours[1]) == len(theirs[1])
    for (train, test), (want_train, want_test) in zip(ours[1], theirs[1], strict=True):
        assert train.dtype == want_train.dtype and test.dtype == want_test.dtype
        assert np.array_equal(train, want_train) and np.array_equal(test, want_test)


@st.composite
def rows_and_folds(draw: st.DrawFn) -> tuple[int, int]:
    rows = draw(st.integers(1, 60))
    # Mostly folds that fit, sometimes as many as the rows, sometimes more (an error) or one (an error).
    folds = draw(st.one_of(st.integers(2, max(2, min(rows, 10))), st.just(rows), st.integers(1, rows + 3)))
    return rows, folds


@EXAMPLES
@given(rows_and_folds(), SEEDS)
@example((5, 5), 0)
@example((2, 2), 1)
@example((4, 5), 0)
@example((7, 1), 0)
def test_kfold_is_scikit_learns(shape: tuple[int, int], seed: int) -> None:
    from sklearn.model_selection import KFold

    rows, folds = shape
    theirs = outcome(lambda: KFold(folds, shuffle=True, random_state=seed).split(np.zeros(rows)))
    assert_same(outcome(lambda: kfold(rows, folds, seed)), theirs)


@st.composite
def labelled(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    """Labels of 1-4 classes, each of its own size (tiny classes too), in any order; and folds."""
    sizes = draw(st.lists(st.integers(1, 20), min_size=1, max_size=4))
    names = draw(st.sampled_from([[3, 0, 7, 1], ["b", "a", "c", "d"]] + ([[True, False]] if len(sizes) < 3 else [])))
    labels = [names[k] for k, size in enumerate(sizes) for _ in range(size)]
    labels = draw(st.permutations(labels))
    folds = draw(st.one_of(st.integers(2, 6), st.just(len(labels))))
    return np.array(labels), folds


@EXAMPLES
@given(labelled(), SEEDS)
@example((np.array([1, 1, 1, 1, 1]), 5), 0)  # one class, as many rows as folds: no error
@example((np.array([1, 1, 1]), 5), 0)  # one class, fewer rows than folds
@example((np.array([1, 1, 0, 0, 1, 0]), 5), 3)  # every class under the folds: an error
@example((np.array([1] * 12 + [0] * 2), 5), 7)  # one class under the folds: a warning
@example((np.array([True, False] * 5), 5), 0)  # as many of each as folds
def test_stratified_kfold_is_scikit_learns(case: tuple[np.ndarray, int], seed: int) -> None:
    from sklearn.model_selection import StratifiedKFold

    labels, folds = case
    theirs = outcome(lambda: StratifiedKFold(folds, shuffle=True, random_state=seed).split(np.zeros(labels.size),
                                                                                            labels))
    assert_same(outcome(lambda: stratified_kfold(labels, folds, seed)), theirs)


#: Confidences that tie, nearly tie (within float64's resolution: 0.1 + 0.2 and 0.3 are merged by
#: scikit-learn, 1e-16 and 0 too) or sit on the ends.
NEAR = [0.0, 1e-16, 0.1, 0.1 + 0.2, 0.3, 0.3 + 2e-16, 0.5, 0.7, 1.0 - 1e-16, 1.0]
CONFIDENCES = st.one_of(st.sampled_from(NEAR), st.floats(0.0, 1.0),
                        st.integers(0, 20).map(lambda k: k / 20))


@st.composite
def gold(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """(confidence, right) rows: right as 0/1 (what calibration passes) or, now and then, any share in [0, 1]."""
    n = draw(st.integers(1, 80))
    x = draw(st.lists(CONFIDENCES, min_size=n, max_size=n))
    kind = draw(st.sampled_from(["right", "right", "constant", "share"]))
    if kind == "share":
        y = draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))
    elif kind == "constant":
        y = [float(draw(st.booleans()))] * n
    else:
        y = [float(b) for b in draw(st.lists(st.booleans(), min_size=n, max_size=n))]
    return np.array(x, dtype=np.float64), np.array(y, dtype=np.float64)


@EXAMPLES
@given(gold())
@example((np.array([0.5]), np.array([1.0])))
@example((np.array([0.2, 0.2, 0.2]), np.array([1.0, 0.0, 1.0])))
@example((np.array([0.1 + 0.2, 0.3, 0.3, 0.9]), np.array([1.0, 0.0, 0.0, 1.0])))
@example((np.array([0.0, 1e-16, 1.0, 1.0]), np.array([1.0, 1.0, 0.0, 0.0])))
@example((np.linspace(0, 1, 30), np.zeros(30)))
# Adjacent blocks of one mean are pooled all the same (scipy's >=), which rounds: 0.1 becomes
# 0.10000000000000002 in both, where leaving them apart would keep 0.1.
@example((np.array([0.2, 0.4, 0.4]), np.array([0.1, 0.1, 0.1])))
@example((np.array([0.1, 0.2, 0.3]), np.array([0.1, 0.2, 0.0])))
@example((np.linspace(0, 0.5, 6), np.array([1.0, 0.4, 0.8, 0.7, 0.3, 0.6])))  # ... and so is the next point
@example((np.array([0.1, 0.5, 0.9]), np.array([-0.5, 0.5, 1.5])))  # outside [0, 1]: clipped
@example((np.linspace(1, 0, 30), np.r_[np.ones(15), np.zeros(15)]))
def test_the_isotonic_points_are_scikit_learns_to_the_bit(rows: tuple[np.ndarray, np.ndarray]) -> None:
    from sklearn.isotonic import IsotonicRegression

    x, y = rows
    want = IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip").fit(x, y)
    got_x, got_y = isotonic_points(x, y)
    assert got_x.dtype == want.X_thresholds_.dtype and got_y.dtype == want.y_thresholds_.dtype
    assert got_x.tobytes() == want.X_thresholds_.tobytes()
    assert got_y.tobytes() == want.y_thresholds_.tobytes()


def test_the_isotonic_fit_refuses_what_scikit_learn_refuses() -> None:
    from sklearn.isotonic import IsotonicRegression

    for x, y in (([], []), ([0.5, np.nan], [1, 0]), ([0.5, 0.6], [1, 0, 1])):
        with pytest.raises(ValueError):
            IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(np.array(x), np.array(y))
        with pytest.raises(ValueError):
            isotonic_points(x, y)


def test_a_calibrated_isotonic_map_applies_as_scikit_learns_predicts() -> None:
    """The map calibration stores (its points) gives what the fitted scikit-learn model predicts,
    inside the gold rows' range and clipped outside it."""
    from sklearn.isotonic import IsotonicRegression

    rng = np.random.default_rng(5)
    c = np.round(rng.random(300), 2)
    right = rng.random(300) < c**2
    fitted = cal.fit("isotonic", c, right, "m", ["a", "b"])
    want = IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip").fit(c, right)
    probe = np.linspace(0, 1, 201)
    assert np.allclose(fitted.apply(probe), want.predict(probe), rtol=0, atol=1e-12)
