"""The verdict (cost.verdict, issue 52): measured money decides; assumed fixed costs give a break-even
volume and never flip it; the advisor never says enable while speculation costs more per token."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specwatch.collector.reads.breakdown import Comparison
from specwatch.cost.advisor import Recommendation, ScenarioEvidence
from specwatch.cost.concurrency import Crossover
from specwatch.cost.inputs import load_prices
from specwatch.cost.model import CostInputs, HiddenCosts, ModeMeasure, tco
from specwatch.cost.summary import priced_advice, render_text, summarize
from specwatch.cost.verdict import verdict_of


def _arm(mode: str, tokens_per_s: float) -> ModeMeasure:
    drafter = "ngram" if mode == "speculative" else None
    return ModeMeasure(mode, drafter, 1000, 1_000_000, 86_400.0, tokens_per_s, drafts=100, draft_tokens=400)


def _inputs(spec_tokens_per_s: float, volume: float = 50e6, hidden: HiddenCosts = HiddenCosts()) -> CostInputs:
    arms = (_arm("autoregressive", 100.0), _arm("speculative", spec_tokens_per_s))
    return CostInputs(arms, load_prices(), "H100-SXM", monthly_output_tokens=volume, hidden=hidden)


def test_a_measured_saving_stays_a_saving_whatever_the_assumed_fixed_costs():
    """A laptop's volume: the per-token saving is small, the default fixed costs (incidents, reserve) are
    large. The verdict says it pays, and the volume above which it would pay them too."""
    costs = tco(_inputs(150.0, volume=1e6))
    v = verdict_of(costs)
    spec, plain = (next(a for a in costs.arms if a.key == k) for k in ("speculative:ngram", "autoregressive"))
    per_token = (plain.total_usd_per_mtok - spec.total_usd_per_mtok) / 1e6
    assert v.paying is True and v.saving_usd_per_month == pytest.approx(per_token * 1e6)
    assert v.fixed_usd_per_month > 100 * v.saving_usd_per_month  # the assumptions dwarf the measured saving
    assert v.break_even_tokens_per_month == pytest.approx(v.fixed_usd_per_month / per_token)
    assert v.fixed_estimate and "(estimate)" in v.sentence and "is paying" in v.sentence
    assert f"pays above ~{v.break_even_tokens_per_month:,.0f} tokens/month" in v.sentence
    assert v.throughput_ratio == pytest.approx(1.5)  # 150 against 100 tokens per device-second


def test_a_loss_per_token_is_not_paying_and_names_both_speeds():
    comparison = Comparison("arm", None, None, 2.37, 0.001)  # faster per request, dearer per token
    v = verdict_of(
        tco(_inputs(60.0)),
        comparison,
        knee=Crossover("H100-SXM", "ngram", 4, "speculation costs more per token from level 4"),
    )
    assert v.paying is False and v.saving_usd_per_month < 0 and v.break_even_tokens_per_month is None
    assert "is not paying" in v.sentence and "latency 2.37x (A/B arms)" in v.sentence
    assert "device throughput 0.60x" in v.sentence and "from concurrency 4" in v.sentence
    by_mode = verdict_of(tco(_inputs(60.0)), replace(comparison, by="mode"))
    assert "(by mode (biased))" in by_mode.sentence and "Knee: not measured." in by_mode.sentence


def test_without_a_plain_arm_nothing_is_claimed():
    inputs = _inputs(150.0)
    v = verdict_of(tco(replace(inputs, arms=inputs.arms[1:])))
    assert v.paying is None and v.sentence.startswith("Not measured: no plain-decoding arm")


def test_the_advisor_never_enables_a_drafter_that_costs_more_per_token():
    evidence = ScenarioEvidence("chat", 100, 100, ("ngram",), *[None] * 11, 1, None, None, False, True)
    enable = Recommendation("chat", "enable", "guidance+measured", "latency-sensitive chat", (), evidence)
    keep = Recommendation("long", "disable", "guidance", "contexts > 128K", (), evidence)
    losing, paying = verdict_of(tco(_inputs(60.0))), verdict_of(tco(_inputs(150.0)))
    assert [r.action for r in priced_advice([enable, keep], losing)] == ["canary", "disable"]
    assert "more per 1M tokens" in priced_advice([enable], losing)[0].reason
    assert priced_advice([enable, keep], paying) == [enable, keep]


def test_the_cost_text_opens_with_the_verdict():
    summary = summarize(_inputs(150.0))
    assert render_text(summary).splitlines()[0] == f"Verdict: {summary.verdict.sentence}"
