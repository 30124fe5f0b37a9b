"""The pieces of `sparkbatch review` that need no Label Studio: the labeling config, the task data
keys, which annotation of a task counts, and where the server's address and key come from."""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET

import pytest

from sparkbatch_dagster.cli.review import server_of
from sparkbatch_dagster.errors import SparkbatchError
from sparkbatch_dagster.review.label_studio import label_config, project_title
from sparkbatch_dagster.review.label_studio_import import finished, picked
from sparkbatch_dagster.review.queue import QueueRow, text_keys


def test_the_config_is_one_choice_over_the_labels_under_each_text_column():
    labels = ["a&b", "c\"d", "plain"]
    root = ET.fromstring(label_config(labels, ["subject", "body text", "label", "$x"]))
    texts = [(t.get("name"), t.get("value")) for t in root.iter("Text")]
    assert texts == [("subject", "$subject"), ("text_1", "$text_1"), ("text_2", "$text_2"), ("text_3", "$text_3")]
    assert [h.get("value") for h in root.iter("Header")] == ["subject", "body text", "label", "text_3"]
    (choices,) = root.iter("Choices")
    assert (choices.get("name"), choices.get("toName"), choices.get("choice")) == ("label", "subject", "single")
    assert [c.get("value") for c in choices.iter("Choice")] == labels  # escaped in the XML, intact when parsed


def test_a_task_carries_the_row_id_and_its_text_fields():
    assert text_keys(["row_id", "text"]) == [("row_id", "text_0"), ("text", "text")]
    row = QueueRow("id-1", "fruit", 0.25, "m", {"text": "A cherry."})
    assert row.data() == {"row_id": "id-1", "text": "A cherry."}


def test_the_latest_annotation_that_is_not_cancelled_counts():
    old = {"id": 1, "updated_at": "2026-12-06T10:00:00Z", "was_cancelled": False,
           "result": [{"from_name": "label", "type": "choices", "value": {"choices": ["fruit"]}}]}
    new = {**old, "id": 2, "updated_at": "2026-12-06T11:00:00Z",
           "result": [{"from_name": "label", "type": "choices", "value": {"choices": ["animal"]}}]}
    skipped = {"id": 3, "updated_at": "2026-12-06T12:00:00Z", "was_cancelled": True, "result": []}
    assert finished({"annotations": [new, old, skipped]}) == new and picked(new) == "animal"
    assert finished({"annotations": [skipped]}) is None and finished({}) is None
    assert picked({"result": [{"from_name": "other", "type": "choices", "value": {"choices": ["x"]}}]}) is None


def test_the_address_and_key_come_from_flags_or_the_environment(monkeypatch):
    monkeypatch.setenv("LABEL_STUDIO_URL", "http://env:8080")
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", "env-key")
    assert server_of(argparse.Namespace(url=None, api_key=None)) == server_of(
        argparse.Namespace(url="http://env:8080", api_key="env-key"))
    assert server_of(argparse.Namespace(url="http://flag:1", api_key="k")).url == "http://flag:1"
    monkeypatch.delenv("LABEL_STUDIO_URL")
    with pytest.raises(SparkbatchError, match="pass --url or set LABEL_STUDIO_URL"):
        server_of(argparse.Namespace(url=None, api_key=None))
    monkeypatch.delenv("LABEL_STUDIO_API_KEY")
    with pytest.raises(SparkbatchError, match="pass --api-key or set LABEL_STUDIO_API_KEY"):
        server_of(argparse.Namespace(url="http://x", api_key=None))


@pytest.mark.parametrize("title", ["ab", "x" * 51])
def test_a_title_label_studio_would_refuse_is_named_with_the_fix(title):
    with pytest.raises(SparkbatchError, match="must be 3 to 50 characters: name one with --project"):
        project_title(title)


def test_an_import_after_a_label_set_change_names_every_bad_row():
    from sparkbatch_dagster.review.label_studio_import import outside
    from sparkbatch_dagster.run.human_labels import HumanLabel

    found = [HumanLabel.of(f"pkg-{i}", "old" if i % 2 else "fruit", "ann@example.com", "2026-12-06T10:00:00Z",
                           f"label-studio:1/{i}/{i}", ["fruit", "old"]) for i in range(15)]
    line = outside(found, ["fruit", "animal"])
    assert line.startswith("7 annotation(s) chose a label that is not one of the job's labels ['animal', 'fruit']")
    assert all(f"row 'pkg-{i}': 'old'" in line for i in (1, 3, 5, 7, 9)) and "and 2 more" in line
    assert "nothing was imported" in line and "\n" not in line
    assert outside(found[::2], ["fruit"]) == ""
