"""Break-even from the engine's step-cost curve, both times at the same batch size (issue 25 #5).

A hand curve: alpha* from its times is the consistent-units formula; the curve's batch with most forwards
is used; a curve without the rows falls back to the records with a warning. A store (both databases,
through the API) with the engine's `step_costs` event: source step_curve; without it: records, warned.
"""

from __future__ import annotations

import pytest
from collector_payloads import T0, plain_request_dict, request_dict
from scipy.optimize import brentq

from specwatch.collector.reads.curve_reads import CurvePoint, StoredCurve, parse_points
from specwatch.cost.breakeven import RECORDS, STEP_CURVE, break_even, break_even_alpha, speedup_from_times
from specwatch.cost.inputs import load_prices
from specwatch.cost.model import CostInputs, ModeMeasure
from specwatch.cost.summary import render_text, summarize

WINDOW = {"start": T0, "end": T0 + 120}


def _arm(mode: str, tokens_per_s: float, **more) -> ModeMeasure:
    drafter = "ngram" if mode == "speculative" else None
    return ModeMeasure(mode, drafter, 1000, 1_000_000, 86_400.0, tokens_per_s, **more)


# gamma = 400 / 100 = 4; t_draft = 1.2 s / 400 = 3 ms per drafted token, of one request
SPEC = _arm("speculative", 150.0, drafts=100, draft_tokens=400, accepted_tokens=200, draft_s=1.2, verify_s=30.0)
PLAIN = _arm("autoregressive", 100.0, verify_s=20.0)


def _curve(*points: tuple, instance: str = "gpu-0") -> StoredCurve:
    return StoredCurve(instance, T0, tuple(CurvePoint(*p) for p in points))


# batch 4: 40 ms plain, 50 ms at 3 rows, 70 ms at 7: 60 ms at gamma + 1 = 5 (interpolated); batch 1: fewer forwards
HAND = _curve((1, 1.0, 0.030, 50), (1, 5.0, 0.033, 40), (4, 1.0, 0.040, 900), (4, 3.0, 0.050, 300), (4, 7.0, 0.070, 80))


def test_alpha_from_the_curve_is_the_formula_in_consistent_units():
    (found,) = break_even(CostInputs((PLAIN, SPEC), load_prices(), "H100-SXM", step_curves=(HAND,)))
    assert found.times_from == STEP_CURVE and found.batch == 4 and found.curve_instance == "gpu-0"
    assert (found.t_plain_s, found.t_verify_s, found.t_draft_s) == pytest.approx((0.040, 0.060, 0.003))
    # per request at batch 4: c = 3 ms / (60 ms / 4) = 0.2
    assert found.verify_cost_ratio == pytest.approx(1.5) and found.draft_cost_ratio == pytest.approx(0.2)
    # S(alpha) = E(alpha, 4) x 40/4 ms / (60/4 ms + 4 x 3 ms) crosses 1 where v (gamma c + 1) = 1.5 x 1.8 plain steps do
    root = brentq(lambda a: speedup_from_times(a, 4, 0.010, 0.015, 0.003) - 1.0, 0.0, 1.0, xtol=1e-12)
    assert found.speedup_alpha == pytest.approx(root, abs=1e-9) == pytest.approx(break_even_alpha(4, 0.2, 1.5))
    assert found.speedup_alpha == pytest.approx(0.686, abs=5e-4)
    assert [p.batch for p in found.step_points] == [4, 4, 4] and not found.warnings
    text = render_text(summarize(CostInputs((PLAIN, SPEC), load_prices(), "H100-SXM", step_curves=(HAND,))))
    assert "times from step_curve: t_plain 40.00 ms, t_verify 60.00 ms per forward of 4, t_draft 3.00 ms" in text


def test_without_a_plain_arm_the_curve_still_measures_v():
    (found,) = break_even(CostInputs((SPEC,), load_prices(), "H100-SXM", step_curves=(HAND,)))
    assert found.times_from == STEP_CURVE and found.verify_cost_ratio == pytest.approx(1.5)
    assert found.measured_speedup is None and found.benefit_alpha is None  # those need a plain arm


def test_a_curve_without_the_rows_falls_back_to_the_records_with_a_warning():
    short = _curve((1, 1.0, 0.030, 50), (1, 3.0, 0.033, 40), (4, 1.5, 0.045, 10))  # gamma + 1 = 5: not measured
    (found,) = break_even(CostInputs((PLAIN, SPEC), load_prices(), "H100-SXM", step_curves=(short,)))
    assert found.times_from == RECORDS and found.batch is None and not found.step_points
    assert any("lacks the rows needed" in w and "gpu-0 b=1: rows 1-3" in w for w in found.warnings)
    assert found.t_plain_s == pytest.approx(20.0 / PLAIN.target_forwards)  # the records' totals


def test_a_vllm_arm_without_a_curve_uses_the_records_unwarned():
    gateway = ModeMeasure(**{**SPEC.__dict__, "device_s_source": "processor_sharing"})
    (found,) = break_even(CostInputs((PLAIN, gateway), load_prices(), "H100-SXM"))
    assert found.times_from == RECORDS and not any("curve" in w for w in found.warnings)


def test_malformed_points_are_skipped():
    bad = [[1, 0.5, 0.04, 3], [2, 2, -1, 1], [True, 1, 1, 1], "x", [1, 2, 3], [1, 2, float("nan"), 1]]
    detail = {"points": [[1, 1, 0.04, 3], *bad, [4, 2.5, 0.05, 2]]}
    assert parse_points(detail) == (CurvePoint(1, 1.0, 0.04, 3), CurvePoint(4, 2.5, 0.05, 2))
    assert parse_points({}) == () and parse_points({"points": "nope"}) == ()


def _event(at: float, points: list, instance: str = "gpu-0") -> dict:
    return {"instance": instance, "at": at, "kind": "step_costs", "detail": {"points": points}}


def _records() -> list[dict]:
    timed = {"device_s_source": "engine", "e2e_s": 2.0, "device_s": 1.0}
    spec = [request_dict(i, started_at=T0 + 5 * i, draft_s=0.2, verify_s=1.2, **timed) for i in range(10)]
    plain = [plain_request_dict(50 + i, started_at=T0 + 5 * i + 1, verify_s=1.5, **timed) for i in range(10)]
    return spec + plain


def test_the_store_with_the_event_says_step_curve_and_without_it_records(client):
    assert client.post("/v1/ingest", json={"requests": _records()}).status_code == 200
    bare = client.get("/v1/cost", params=WINDOW).json()["break_even"][0]
    assert bare["times_from"] == RECORDS
    assert any("no step-cost curve stored" in w for w in bare["warnings"])
    old = _event(T0 + 10, [[1, 1, 0.9, 5], [1, 5, 0.95, 5]])
    latest = _event(T0 + 100, [[1, 1, 0.040, 500], [1, 3, 0.050, 200], [1, 7, 0.070, 90]])
    outside = _event(T0 + 500, [[1, 1, 5.0, 9], [1, 9, 6.0, 9]])
    other = _event(T0 + 50, [[1, 1, 0.040, 5000], [1, 9, 0.200, 5000]], instance="elsewhere")  # served nothing here
    assert client.post("/v1/ingest", json={"events": [old, latest, outside, other]}).status_code == 200
    found = client.get("/v1/cost", params=WINDOW).json()["break_even"][0]
    assert found["times_from"] == STEP_CURVE and found["batch"] == 1 and found["curve_instance"] == "gpu-0"
    assert found["t_plain_s"] == pytest.approx(0.040) and found["t_verify_s"] == pytest.approx(0.060)  # gamma 4
    assert [p["rows"] for p in found["step_points"]] == [1.0, 3.0, 7.0]
    assert not any("curve" in w for w in found["warnings"])
