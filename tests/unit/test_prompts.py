import pytest

from sparkbatch_dagster.errors import ConfigError
from sparkbatch_dagster.spec.prompts import check_text, render


def test_input_that_looks_like_template_syntax_stays_data():
    p = render("", "Text: {{ text }}", {"text": "{{ 7*7 }} {% for x in range(3) %}x{% endfor %}"})
    assert p.user == "Text: {{ 7*7 }} {% for x in range(3) %}x{% endfor %}"


def test_sandbox_blocks_python_internals():
    with pytest.raises(ConfigError, match="template failed to render"):
        render("", "{{ text.__class__.__mro__[1].__subclasses__() }}", {"text": "x"})


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "null_text"),
        ("   ", "empty_text"),
        ("x" * 101, "too_long"),
        ("bad\x00byte", "invalid_text"),
        (b"\xff\xfe", "invalid_text"),
        ("broken \ufffd char", "invalid_text"),
        (12, "bad_type"),
    ],
)
def test_bad_values_have_reasons(value, reason):
    assert check_text(value, "text", 100).startswith(reason)


def test_good_values_pass():
    assert check_text("fine\ttext\nwith lines", "text", 100) is None
    assert check_text("caf\u00e9".encode(), "text", 100) is None
