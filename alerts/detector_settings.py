"""The change detectors' parameters: the `detectors:` section of the rules file (`alerts.rules`).

`drift` tunes the per-series baseline and CUSUM (`alerts.drift`), `regression` the before/after
comparison at deploy markers (`alerts.regression`), `anomalies` the per-request flags
(`alerts.anomalies`). docs/alerts.md gives each parameter's effect on delay and false alarms, as
measured by bench/drift.py.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from specwatch.alerts.durations import Duration


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DriftSettings(_Strict):
    """A series is (model, drafter, instance, the first of `tag_keys` a request carries)."""

    tag_keys: tuple[str, ...] = ("scenario", "tenant")
    min_drafted_tokens: int = Field(default=8, ge=1)  # requests drafting fewer are too noisy to count
    warmup: int = Field(default=1000, ge=10)  # requests that set a series' baseline (mean, stddev)
    baseline_memory: int = Field(default=20_000, ge=100)  # requests the baseline learns from, then its EWMA span
    learn_below_score: float = Field(default=0.5, ge=0, le=1)  # in control: the baseline learns (0: warmup only)
    relative_shift: float = Field(default=0.15, gt=0, lt=1)  # the drop the CUSUM is tuned to detect
    decision_interval: float = Field(default=35.0, gt=0)  # h, in baseline spreads of the statistic: score = CUSUM / h
    ewma_halflife: int = Field(default=200, ge=1)  # requests: the level reported beside the baseline
    rebaseline_after: int = Field(default=5000, ge=0)  # requests past an alarm before a new baseline (0: never)
    min_stddev: float = Field(default=0.02, gt=0)  # floor of the statistic's spread per √drafted (a drafter at 1.0)
    max_series: int = Field(default=500, ge=1)  # bounds the series (and the gauge's label sets)
    initial_lookback: Duration = Field(default=6 * 3600.0, gt=0)  # how far back a fresh store starts
    # rows the drift and anomaly passes step per cycle (~16 us each in Python): 50,000 keeps a cycle near a
    # second, so a collector stops promptly and ingest is not starved; 3,300 requests/s at a 15 s interval
    max_rows_per_cycle: int = Field(default=50_000, ge=1)


class RegressionSettings(_Strict):
    lookback: Duration = Field(default=6 * 3600.0, gt=0)  # markers this recent are compared
    side: Duration = Field(default=3600.0, gt=0)  # the before and the after window's length
    min_requests: int = Field(default=30, ge=2)  # on each side
    alpha: float = Field(default=0.01, gt=0, lt=1)  # one-sided Mann-Whitney U: after < before
    min_drafted_tokens: int = Field(default=8, ge=1)


class AnomalySettings(_Strict):
    min_drafted_tokens: int = Field(default=16, ge=1)
    mad_k: float = Field(default=5.0, gt=0)  # |x - median| > k * 1.4826 * MAD of the series
    min_series_requests: int = Field(default=50, ge=5)  # a series' distribution needs this many
    repetition_acceptance: float = Field(default=0.95, gt=0, le=1)
    repetition_min_output: int = Field(default=128, ge=1)
    collapse_acceptance: float = Field(default=0.05, ge=0, lt=1)
    collapse_min_median: float = Field(default=0.3, gt=0, le=1)  # "a drafter that usually works"
    history: int = Field(default=1000, ge=0)  # a series' recent requests a new one is judged with
    # `collapse` of a drafter new at a marker: the instance and model's requests in the regression's `side`
    # before its latest config marker are the baseline; it needs this many
    baseline_min_requests: int = Field(default=30, ge=2)


class DetectorSettings(_Strict):
    drift: DriftSettings = DriftSettings()
    regression: RegressionSettings = RegressionSettings()
    anomalies: AnomalySettings = AnomalySettings()
