"""The review threshold (run/review_queue.py): review_below until a review budget has been turned
into a threshold on the gold rows, the stored one while the spec asks for the same target, and a
damaged file stopping with its name and the fix."""


from sparkbatch_dagster.home import JobHome
from sparkbatch_dagster.run.review_queue import Interval, ReviewThreshold, save_threshold, threshold_of, threshold_path
from testkit import make_spec

SHARE = Interval(value=0.5, low=0.3, high=0.7, count=10, of=20)


def plan(asked: str = "budget", target: float = 0.1, threshold: float = 0.42) -> ReviewThreshold:
    return ReviewThreshold(asked=asked, target=target, threshold=threshold, reviewed=SHARE,  # type: ignore[arg-type]
                           caught=SHARE, gold_rows=100, errors=20, folds=5)


def test_without_a_review_budget_the_threshold_is_review_below(tmp_path):
    spec = make_spec(tmp_path, review_below=0.3)
    home = JobHome(tmp_path / "home")
    save_threshold(home, plan())  # a stored plan does not matter to a spec that asks for none
    assert threshold_of(spec, home).threshold == 0.3 and threshold_of(spec, home).plan is None


def test_a_budget_uses_the_stored_threshold_of_the_same_target_only(tmp_path):
    spec = make_spec(tmp_path, review={"budget": 0.1})
    home = JobHome(tmp_path / "home")
    before = threshold_of(spec, home)
    # No plan yet: a budget still queues its share (ranked by confidence), and says what it used
    assert before.share == 0.1 and before.plan is None and "has no plan from gold rows yet" in before.why
    assert before.describe() == "least sure 0.1 of rows"
    save_threshold(home, plan(threshold=0.42))
    got = threshold_of(spec, home)
    assert got.share == 0.1 and got.threshold == 0.42 and got.plan == plan(threshold=0.42) and not got.why
    other = make_spec(tmp_path, review={"budget": 0.2})  # the spec changed its mind: the old plan is not its
    assert threshold_of(other, home).share == 0.2 and threshold_of(other, home).plan is None
    errors = make_spec(tmp_path, review={"catch_errors": 0.1})
    got = threshold_of(errors, home)  # an error target needs a plan: review_below stands in, said
    assert got.plan is None and got.share is None and got.threshold == errors.review_below
    assert "review_below=0.5 stands in" in got.why


def test_a_damaged_threshold_file_is_left_out_and_the_budget_still_queues_its_share(tmp_path, caplog):
    spec = make_spec(tmp_path, review={"budget": 0.1})
    home = JobHome(tmp_path / "home")
    threshold_path(home).parent.mkdir(parents=True)
    threshold_path(home).write_text('{"asked": "budget"')
    got = threshold_of(spec, home)
    assert got.plan is None and got.share == 0.1 and "no plan from gold rows yet" in got.why
    assert "threshold.json is left out" in caplog.text
