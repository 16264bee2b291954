"""The Tuning page's chart: predicted tokens/s against k, one line per batch-size bucket, today's k and
the recommended k marked."""

from __future__ import annotations

import altair as alt
import pandas as pd


def tuning_curves(frame: pd.DataFrame) -> alt.LayerChart:
    base = alt.Chart(frame).encode(
        x=alt.X("k:Q", title="k (draft tokens per step; 0 = plain)", axis=alt.Axis(tickMinStep=1)),
        y=alt.Y("tokens/s:Q", title="predicted output tokens/s of the batch"),
        color=alt.Color("batch:N", title="batch size", sort=None),
        tooltip=["batch", "k", alt.Tooltip("tokens/s:Q", format=".1f"), alt.Tooltip("low:Q", format=".1f"),
                 alt.Tooltip("high:Q", format=".1f")],
    )  # fmt: skip
    band = base.mark_area(opacity=0.15).encode(y="low:Q", y2="high:Q")
    today = base.transform_filter(alt.datum.today).mark_point(shape="circle", size=90, filled=False)
    chosen = base.transform_filter(alt.datum.recommended).mark_point(shape="diamond", size=110, filled=True)
    return alt.layer(band, base.mark_line(), today, chosen)
