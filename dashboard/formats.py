"""How the dashboard prints figures: dollars, the collector's rule thresholds, and empty table cells.

Pure functions (no Streamlit): the pages and `dashboard.state` call them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import pandas as pd

# What an empty cell means, per column; any other column says "not measured".
MISSING = {
    "acceptance_rate": "no drafts",
    "mean_acceptance_length": "no drafts",
    "energy_j_per_token": "not metered",
    "energy_source": "not metered",
    "energy source": "not metered",
    "payback (months)": "never (no saving)",
    "error": "none",
    "fired_at": "not fired",
    "resolved_at": "not resolved",
    "last_sent_at": "not sent",
    "value": "no value",
    "last evaluated": "not yet",
    "delivered": "not yet",
    "last error": "none",
    "instance": "all",
    "labels": "none",
    "detail": "none",
    "export command": "too few captures",
}
NOT_MEASURED = "not measured"


def as_markdown_text(text: str) -> str:
    """`text` shown as itself inside Markdown: every character Markdown (or Streamlit's LaTeX, `$`) reads escaped."""
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|<>$~])", r"\\\1", text)


def usd(value: float | None, missing: str = "—") -> str:
    """$64.95; $1.2k and $3.4M for large sums; two significant digits under a dollar ($0.0042)."""
    if _missing(value):
        return missing
    sign, size = "-" if value < 0 else "", abs(value)
    if size >= 1e6:
        text = f"{size / 1e6:,.1f}M"
    elif size >= 1e3:
        text = f"{size / 1e3:,.1f}k"
    elif size >= 1 or size == 0:
        text = f"{size:,.2f}"
    else:
        text = f"{size:.{max(2, 1 - math.floor(math.log10(size)))}f}"
    return f"{sign}${text}"


def p_value(value: float | None, missing: str = "—") -> str:
    """A test's p-value as a reader takes it: "< 0.0001" below that, else four decimals."""
    if _missing(value):
        return missing
    return "< 0.0001" if value < 1e-4 else f"{value:.4f}"


def p_is(value: float | None) -> str:
    """ "p < 0.0001" or "p = 0.0312": a p-value inside a sentence."""
    shown = p_value(value)
    return f"p {shown}" if shown.startswith("<") else f"p = {shown}"


def seconds(value: float) -> str:
    """0.3 -> '300 ms', 1.0 -> '1 s', 2.5 -> '2.5 s'."""
    return f"{value * 1000:.4g} ms" if value < 1 else f"{value:.4g} s"


def duration(value: float) -> str:
    """60 -> '1 min', 90 -> '1.5 min', 7200 -> '2 h'."""
    if value >= 3600:
        return f"{value / 3600:.3g} h"
    return f"{value / 60:.3g} min" if value >= 60 else seconds(value)


def quantity(value: float, unit: str) -> str:
    """A rule threshold in its signal's unit, as its line is labelled."""
    if unit == "seconds":
        return seconds(value)
    return f"{value:g} pp" if unit == "percentage points" else f"{value:g}"


@dataclass(frozen=True)
class Threshold:
    """Where an alert rule of the collector fires: `signal op value` (e.g. ttft_p99 > 1.0)."""

    rule: str
    signal: str
    op: str
    value: float
    unit: str

    @property
    def label(self) -> str:
        return quantity(self.value, self.unit)

    def versus(self, value: float | None, digits: int = 3) -> str | None:
        """'+0.123 vs 0.6', '-412 ms vs 1 s': how far a figure is from this line (None: no figure)."""
        if value is None or math.isnan(value):
            return None
        if self.unit == "seconds":
            return f"{(value - self.value) * 1000:+,.0f} ms vs {self.label}"
        return f"{value - self.value:+.{digits}f} vs {self.label}"

    def caption(self, what: str) -> str:
        return f"Dashed line: {self.rule} fires when {what} {self.op} {self.label}."


def styled(frame: pd.DataFrame, money: tuple[str, ...] = (), digits: int = 3):
    """`frame` for `st.dataframe`: empty cells say what is missing (`MISSING`), `money` columns
    print as dollars, other floats with `digits` decimals. Streamlit draws an empty cell as "None"
    whatever a Styler says, so a column with gaps becomes text; the others stay numbers."""
    if frame.empty:
        return frame
    frame = frame.copy()
    for column in frame.columns:
        if frame[column].map(_missing).any():
            frame[column] = frame[column].map(lambda v, c=column: _cell(v, c, money, digits))
    formatters = {c: usd for c in money if frame[c].dtype.kind in "fi"}
    formatters |= {c: _time for c in frame.columns if frame[c].dtype.kind == "M"}
    return frame.style.format(formatters, precision=digits, thousands=",")


def _time(value: pd.Timestamp) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S")


def _missing(value: object) -> bool:
    return value is None or value is pd.NaT or (isinstance(value, float) and math.isnan(value))


def _cell(value: object, column: str, money: tuple[str, ...], digits: int) -> object:
    if _missing(value):
        return MISSING.get(column, NOT_MEASURED)
    if column in money:
        return usd(value)
    return f"{value:,.{digits}f}" if isinstance(value, float) else str(value)
