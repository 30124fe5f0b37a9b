"""What counts as a row's truth: its gold value, as text, when it says something.

A gold column may be absent on a row (null), empty or blank (a CSV's empty cell read as text, a
spreadsheet's " "), or of another type than the labels (an integer class id against the label
"3"). A null, empty or blank value is no truth: that row is neither right nor wrong, and no
accuracy counts it. Any other value is compared as its text, trimmed. Python (the estimate's sample)
and SQL (the views) read it the same way, and a property test holds them equal. Example::

    truth("  billing ")   # 'billing'
    truth("")             # None: no truth
    truth(3)              # '3'
    f"SELECT {truth_sql('s.team')} AS gold FROM ..."
"""

from __future__ import annotations

from typing import Any

#: The blanks trimmed from a gold value, the same in Python and SQL (DuckDB's trim() alone takes
#: spaces only; Python's strip() alone also takes Unicode spaces).
BLANKS = " \t\n\r\x0b\x0c"


def truth(value: Any) -> str | None:
    """A gold value as the truth it gives: its text, trimmed; None for null, empty or blank."""
    if value is None:
        return None
    text = str(value).lower() if isinstance(value, bool) else str(value).strip(BLANKS)  # DuckDB: true/false
    return text or None


def truth_sql(expr: str) -> str:
    """:func:`truth` in DuckDB's SQL, over the column expression ``expr``."""
    blanks = " || ".join(f"chr({ord(c)})" for c in BLANKS)
    return f"nullif(trim(CAST({expr} AS VARCHAR), {blanks}), '')"
