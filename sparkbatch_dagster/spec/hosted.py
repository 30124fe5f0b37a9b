"""Hosted batch prices: the user's own table of what a hosted batch API charges per million
input and output tokens, so the estimate can put the same job's tokens at those prices beside
the box's options.

No price lives in this package: prices change, and only the user knows which provider, model
and date they mean. A table is inline (``EstimateSpec(hosted_prices=[HostedPrice(...)])``, a
list in YAML) or a file (``sparkbatch estimate --hosted-prices prices.yaml``, or the path as
``hosted_prices``): YAML, a list of rows (or ``hosted_prices:`` holding one), or CSV with the
header ``name,input_per_million_usd,output_per_million_usd[,note]``.

Example::

    HostedPrice(name="provider-x small (batch)", input_per_million_usd=0.05, output_per_million_usd=0.20,
                note="example figures, not a quote: copy your provider's batch price and its date")
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

#: The two prices a row must give, in words, for the messages.
PRICES = {"input_per_million_usd": "input", "output_per_million_usd": "output"}


class HostedPrice(BaseModel):
    """One hosted batch offer: USD per million input (prompt) and output (generated) tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="The offer in your words: provider, model, batch tier.")
    input_per_million_usd: float = Field(description="USD per million input (prompt) tokens, 0 or more.")
    output_per_million_usd: float = Field(description="USD per million output (generated) tokens, 0 or more.")
    note: str | None = Field(default=None, description="Where and when you read the price (yours to keep current).")

    @model_validator(mode="before")
    @classmethod
    def _prices_given(cls, data: Any) -> Any:
        # A missing or negative price would quietly make a hosted API look free or cheaper:
        # stop, naming the offer, the value and the fix.
        if not isinstance(data, dict):
            return data
        name = data.get("name") or "(no name)"
        for key, what in PRICES.items():
            value = data.get(key)
            fix = f"give {name!r} the provider's batch price per million {what} tokens in USD ({key}: 0.15)"
            if value is None or (isinstance(value, str) and not value.strip()):
                raise ValueError(f"hosted price {name!r} has no {key}: {fix}")
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"hosted price {name!r}: {key}={value!r} is not a number: {fix}") from None
            if number < 0 or not math.isfinite(number):  # NaN or infinity: not a price either
                raise ValueError(f"hosted price {name!r}: {key}={value!r} is negative or not finite: {fix}")
        return data

    def cost_usd(self, input_tokens: float, output_tokens: float) -> float:
        """What these tokens cost at this offer's prices."""
        return (input_tokens * self.input_per_million_usd + output_tokens * self.output_per_million_usd) / 1e6


def check_table(rows: list[HostedPrice]) -> list[HostedPrice]:
    """Refuse one name twice: the report lists offers by name."""
    names = [r.name for r in rows]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"hosted prices {twice} are listed twice: give each offer one row (or distinct names)")
    return rows


def load_hosted_prices(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a YAML or CSV price table (checked: the errors name the file, row and value)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"hosted price table {str(file)!r} does not exist: give a YAML or CSV file of "
                         "name, input_per_million_usd, output_per_million_usd")
    if file.suffix.lower() == ".csv":
        with file.open(newline="") as f:
            rows: Any = [{k.strip(): (v.strip() if isinstance(v, str) else v) for k, v in r.items() if k}
                         for r in csv.DictReader(f)]
    else:
        import yaml

        rows = yaml.safe_load(file.read_text())
        if isinstance(rows, dict) and "hosted_prices" in rows:
            rows = rows["hosted_prices"]
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"hosted price table {str(file)!r} holds no rows: a YAML list of mappings (or CSV with the "
                         "header name,input_per_million_usd,output_per_million_usd) is expected")
    out = []
    for i, row in enumerate(rows, start=1):
        try:
            out.append(HostedPrice.model_validate({k: (None if v == "" else v) for k, v in row.items()}).model_dump())
        except ValidationError as exc:
            why = "; ".join(str(e["msg"]).removeprefix("Value error, ") + (f" at {'.'.join(map(str, e['loc']))}"
                                                                            if e["loc"] else "") for e in exc.errors())
            raise ValueError(f"{file} row {i}: {why}") from None
    check_table([HostedPrice.model_validate(r) for r in out])
    return out
