"""The cost model against hand-computed cases, the break-even root against closed forms,
monotonicity properties, and inputs measured from records stored in a real database."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from collector_payloads import T0, plain_request_dict, request_dict, sample_dict
from hypothesis import given, settings
from hypothesis import strategies as st

from specwatch.collector.ingest.store import Store
from specwatch.collector.reads.queries import Window
from specwatch.cost.breakeven import (
    alpha_from_mean_acceptance_length,
    at_acceptance,
    benefit_break_even_alpha,
    break_even,
    break_even_alpha,
    draft_cost_ratio,
    expected_speedup,
    sensitivity,
    tokens_per_round,
)
from specwatch.cost.inputs import load_prices, measured_inputs, storage_gb_per_day, what_if_inputs
from specwatch.cost.model import (
    GB,
    Accelerator,
    CostInputs,
    HiddenCosts,
    IdleTime,
    ModeMeasure,
    Prices,
    arm_cost,
    hidden_monthly,
    net_benefit,
    tco,
)
from specwatch.telemetry.schema import IngestBatch

PRICES = Prices(
    {"X": Accelerator("X", 4.0, 80.0, spot_usd_per_hour=1.5, onprem_usd_per_hour=4.0)},
    electricity_usd_per_kwh=0.2,
    pue=1.5,
    storage_usd_per_gb_month=0.08,
    engineer_day_usd=800.0,
    as_of="test",
)
PLAIN = ModeMeasure(
    "autoregressive",
    None,
    requests=100,
    output_tokens=1_000_000,
    window_s=86_400,
    tokens_per_s=100.0,
    energy_j_per_token=3.6,
    energy_source="nvml",
    retries=10,
    target_memory_bytes=40 * GB,
    memory_source="measured",
    verify_s=9_000.0,  # 0.01 s per plain step (999,900 forwards): the break-even's t_plain
)
# the same volume served twice as fast with half the energy, a draft model holding 8 GB more
SPEC = replace(
    PLAIN,
    mode="speculative",
    drafter="model:draft",
    tokens_per_s=200.0,
    energy_j_per_token=1.8,
    energy_source="estimate",
    retries=0,
    draft_memory_bytes=8 * GB,
    drafts=1000,
    draft_tokens=4000,
    accepted_tokens=2000,
    draft_s=0.025 * 0.0105 * 4000,  # c = 0.025 of a verify forward per drafted token
    verify_s=0.0105 * 997_900,  # 0.0105 s per verify forward (1e6 - 100 - 2000 of them): v = 1.05
)


def inputs(**changes) -> CostInputs:
    """On-prem (energy paid on top of the GPU-hour) unless changed."""
    return replace(CostInputs((PLAIN, SPEC), PRICES, "X", monthly_output_tokens=1e9, pricing="on-prem"), **changes)


# --- hand-computed cases ---------------------------------------------------------------------


def test_plain_arm_cost_by_hand():
    cost = arm_cost(PLAIN, inputs(), volume=1e9)
    # 1e6 tokens / 100 tok/s = 10,000 s = 2.7778 GPU h; memory 40 of 80 GB
    assert cost.memory_share == 0.5
    assert cost.gpu_hours_per_mtok == pytest.approx(10_000 / 3600)
    assert cost.compute_usd_per_mtok == pytest.approx(10_000 / 3600 * 4.0 * 0.5)  # 5.5556
    # 3.6 J/token x 1e6 = 3.6e6 J = 1 kWh; x PUE 1.5 x $0.20 x the same half of the device (the rest: other tenants)
    assert cost.energy_kwh_per_mtok == pytest.approx(1.0) and cost.energy_usd_per_mtok == pytest.approx(0.15)
    assert cost.retry_factor == 0.1 and cost.retries_usd_per_mtok == pytest.approx((5.5556 + 0.15) * 0.1, abs=1e-4)
    assert cost.total_usd_per_mtok == pytest.approx(6.27611, abs=1e-5)
    assert cost.monthly_usd == pytest.approx(6.27611 * 1000, abs=1e-2)  # 1e9 tokens = 1000 x 1M
    assert cost.energy_source == "nvml"


def test_cloud_prices_show_energy_without_adding_it():
    cost = arm_cost(PLAIN, inputs(pricing="on-demand"), volume=1e9)
    assert cost.energy_usd_per_mtok == pytest.approx(0.15) and not cost.energy_added  # shown...
    assert cost.total_usd_per_mtok == pytest.approx(5.5556 * 1.1, abs=1e-4)  # ...not added: compute + retries
    spot = arm_cost(PLAIN, inputs(pricing="spot"), volume=1e9)
    assert spot.compute_usd_per_mtok == pytest.approx(10_000 / 3600 * 1.5 * 0.5)
    with pytest.raises(ValueError, match="no reserved price for X"):
        inputs(pricing="reserved")


def test_seed_hidden_costs_by_hand():
    hidden = hidden_monthly(HiddenCosts(), PRICES, "model:draft", spec_monthly_usd=1000.0)
    assert hidden.draft_training_usd == 15_000 / 12 == 1250.0
    assert hidden.monitoring_usd == pytest.approx(15 * 14 * 0.08)  # 15 GB/day kept 14 days (raw retention)
    assert hidden.incidents_usd == pytest.approx(2 * 52 / 12 * 800)  # $6,933.33/month
    assert hidden.opportunity_usd == 0.0
    others = 1250 + 16.8 + 6933.3333
    assert hidden.tech_debt_usd == pytest.approx(0.2 * others)  # reserve on what speculation adds
    assert hidden.total_usd == pytest.approx(others * 1.2) and hidden.reserve_base == "additions"
    whole = hidden_monthly(replace(HiddenCosts(), reserve_base="deployment"), PRICES, "model:draft", 1000.0)
    assert whole.tech_debt_usd == pytest.approx(0.2 * (1000 + others))  # the older reading: the deployment's
    added = hidden_monthly(HiddenCosts(), PRICES, "model:draft", 1000.0, draft_device=50.0, draft_memory=100.0)
    assert added.tech_debt_usd == pytest.approx(0.2 * (150 + others)) and added.total_usd == pytest.approx(
        others + added.tech_debt_usd
    )
    assert hidden.monitoring_source == "default (seed)"
    for untrained in ("ngram", "suffix", "early-exit:12", "mtp"):
        assert hidden_monthly(HiddenCosts(), PRICES, untrained, 0.0).draft_training_usd == 0.0, untrained
    for trained in ("eagle3", "draft_model:llama-68m", "model:draft"):
        assert hidden_monthly(HiddenCosts(), PRICES, trained, 0.0).draft_training_usd == 1250.0, trained
    double_data = HiddenCosts().with_values("given", training_data_fraction=0.2, opportunity_days_per_month=1.5)
    doubled = hidden_monthly(double_data, PRICES, "model:draft", 0.0)
    assert doubled.draft_training_usd == 2500.0 and doubled.opportunity_usd == 1200.0
    assert double_data.source("training_data_fraction") == "given" and double_data.source("pue") == "default (seed)"


def test_benefit_and_payback_by_hand():
    costs = tco(inputs())
    spec = next(a for a in costs.arms if a.key == "speculative:model:draft")
    # 1e6 / 200 = 5000 s = 1.3889 h x $4 x (48/80); 0.5 kWh x 1.5 x 0.2 x 0.6; no retries
    spec_mtok = 5000 / 3600 * 4 * 0.6 + 0.09
    assert spec.total_usd_per_mtok == pytest.approx(spec_mtok)
    (benefit,) = costs.benefits
    saving = (6.276111 - spec_mtok) * 1000
    others = 1250 + 16.8 + 6933.3333
    # the reserve's base: the drafter's device time (draft_s / (draft_s + verify_s) of the arm's month) and its
    # 8 GB of an 80 GB device for a month (730 h x $4), and the hidden costs
    drafting = SPEC.draft_s / (SPEC.draft_s + SPEC.verify_s)
    adds = spec_mtok * 1000 * drafting + 0.1 * 4 * 730
    hidden = others + 0.2 * (adds + others)
    assert benefit.explicit_saving_usd == pytest.approx(saving, rel=1e-5)
    assert benefit.net_usd == pytest.approx(saving - hidden, rel=1e-4)
    assert benefit.net_without_reserve_usd == pytest.approx(saving - others, rel=1e-4)
    recurring = hidden - 1250 * 1.2
    assert saving < recurring and benefit.payback_months is None  # at 1e9 tokens/month the training never pays back
    big = tco(inputs(monthly_output_tokens=1e10)).benefits[0]
    big_recurring = (16.8 + 6933.3333) * 1.2 + 0.2 * (spec_mtok * 10_000 * drafting + 0.1 * 4 * 730)
    assert big.payback_months == pytest.approx(15_000 / (saving * 10 - big_recurring), rel=1e-4)
    assert costs.primary == "speculative:model:draft" and net_benefit(inputs()) == benefit.net_usd
    assert "speculative:model:draft energy (estimate)" in benefit.estimated_from  # on-prem: energy is charged
    assert "incident_days_per_week (seed default)" in benefit.estimated_from


def test_idle_time_is_its_own_line_or_spread_by_share():
    idle = IdleTime(up_s=86_400.0, busy_s=21_600.0)  # a quarter of the day busy
    separate = tco(inputs(idle=idle))
    assert separate.idle.idle_fraction == pytest.approx(0.75)
    # one what-if instance per arm, 3 idle s per busy s: (0.5 x 11,000 s + 0.6 x 5,000 s) x 3 x $4/h in the
    # window, a month of it at the volume priced: 1e9 tokens / the 2e6 the two arms served
    # (plain's failed work, a tenth more, is busy time too)
    assert separate.idle.monthly_usd == pytest.approx((0.5 * 11_000 + 0.6 * 5_000) * 3 * 4 / 3600 * 500)
    assert all(a.idle_usd_per_mtok == 0 for a in separate.arms)
    spread = tco(inputs(idle=idle, idle_allocation="by_share"))
    plain = spread.arms[0]
    # 3 idle s per busy s, and plain decoding's busy time is 1.1 x its ok work (retries)
    assert plain.idle_usd_per_mtok == pytest.approx(plain.compute_usd_per_mtok * 3.3)
    assert tco(inputs()).idle is None and any("idle time not measured" in n for n in tco(inputs()).notes)


def test_assumptions_name_every_input_and_its_source():
    table = {row.name: row for row in tco(inputs(idle=IdleTime(100.0, 50.0))).assumptions}
    assert table["X on-prem price"].value == 4.0 and table["X on-prem price"].source == "price table test"
    assert table["incident_days_per_week"].source == "default (seed)"
    assert table["speculative:model:draft energy"].source == "estimate"
    assert table["autoregressive energy"].source == "measured (nvml)"
    assert table["idle device time"].value == 50.0
    assert table["monthly output tokens"].source == "given"
    given = tco(inputs(hidden=HiddenCosts().with_values("config", tech_debt_buffer=0.1))).assumptions
    assert next(r for r in given if r.name == "tech_debt_buffer").source == "config"


def test_observed_volume_unmeasured_energy_and_labels():
    unmetered = replace(SPEC, energy_j_per_token=None, energy_source=None)
    got = tco(inputs(arms=(PLAIN, unmetered), monthly_output_tokens=None))
    assert got.volume_source == "observed" and got.monthly_output_tokens == pytest.approx(2e6 / 86_400 * 730 * 3600)
    spec = got.arms[1]
    assert spec.energy_usd_per_mtok == 0.0 and spec.energy_source is None and spec.energy_kwh_per_mtok is None
    assert any("energy not measured" in n for n in got.notes)
    assert any("estimate" in n for n in tco(inputs()).notes)  # an estimate stays labelled as one
    whole = replace(PLAIN, target_memory_bytes=None, memory_source="unmeasured")
    assert arm_cost(whole, inputs(arms=(whole, SPEC)), 1e9).memory_share == 1.0


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda: replace(PRICES, pue=0.9), "pue"),
        (lambda: inputs(gpu_type="B200"), "unknown GPU type 'B200'"),
        (lambda: inputs(arms=(PLAIN, PLAIN)), "one measure per"),
        (lambda: replace(PLAIN, tokens_per_s=0), "tokens_per_s"),
        (lambda: HiddenCosts(amortisation_months=0), "amortisation_months"),
    ],
)
def test_bad_inputs_are_value_errors(change, message):
    with pytest.raises(ValueError, match=message):
        change()


# --- break-even --------------------------------------------------------------------------------


def _closed_form(gamma: int, c: float) -> float:
    """Speed-up 1 <=> 1 + a + ... + a^gamma = gamma c + 1: the polynomial's root in [0, 1]."""
    if gamma == 1:
        return c  # (1 + a) / (c + 1) = 1
    if gamma == 2:
        return (-1 + math.sqrt(1 + 8 * c)) / 2  # a^2 + a - 2c = 0
    roots = np.roots([1.0] * gamma + [-gamma * c])  # a^gamma + ... + a - gamma c = 0
    return float(next(r.real for r in roots if abs(r.imag) < 1e-12 and 0 <= r.real <= 1))


@pytest.mark.parametrize("gamma", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("c", [0.01, 0.05, 0.2, 0.5, 0.9])
def test_break_even_root_matches_closed_form(gamma, c):
    alpha = break_even_alpha(gamma, c)
    assert alpha == pytest.approx(_closed_form(gamma, c), abs=1e-9)
    assert expected_speedup(alpha, gamma, c) == pytest.approx(1.0, abs=1e-9)


def test_break_even_edges():
    assert break_even_alpha(4, 0.0) == 0.0  # free drafting never slows down
    assert break_even_alpha(4, 1.0) is None and break_even_alpha(4, 1.5) is None  # never pays
    assert expected_speedup(0.0, 4, 0.1) == pytest.approx(1 / 1.4)
    assert expected_speedup(1.0, 4, 0.1) == pytest.approx(5 / 1.4)
    assert expected_speedup(0.8, 4, 0.05) == pytest.approx((1 - 0.8**5) / (0.2 * 1.2))
    assert draft_cost_ratio(draft_s=10.0, verify_s=100.0, drafts=1000, draft_tokens=4000) == pytest.approx(0.025)
    assert draft_cost_ratio(1.0, 0.0, 10, 40) is None


@pytest.mark.parametrize("gamma", [1, 3, 4, 7])
def test_alpha_from_mean_acceptance_length_inverts(gamma):
    for alpha in (0.0, 0.1, 0.5, 0.73, 0.95):
        assert alpha_from_mean_acceptance_length(tokens_per_round(alpha, gamma), gamma) == pytest.approx(
            alpha, abs=1e-8
        )
    assert (
        alpha_from_mean_acceptance_length(1.0, gamma) == 0.0
        and alpha_from_mean_acceptance_length(gamma + 1, gamma) == 1.0
    )
    # gamma = 1: E = 1 + alpha
    assert alpha_from_mean_acceptance_length(1.6, 1) == pytest.approx(0.6)


def test_net_benefit_break_even_and_curve():
    model = inputs(monthly_output_tokens=5e9)
    alpha = benefit_break_even_alpha(model)
    assert 0 < alpha < 1
    assert net_benefit(at_acceptance(model, alpha, SPEC.key)) == pytest.approx(0.0, abs=1e-3)
    (row,) = break_even(model)
    assert row.measured_alpha == pytest.approx(alpha_from_mean_acceptance_length(1 + 2000 / 1000, 4.0))
    assert row.gamma == 4.0 and row.draft_cost_ratio == pytest.approx(0.025) and row.measured_speedup == 2.0
    nets = [net for _, _, net in row.curve]
    assert nets == sorted(nets)  # more acceptance, more benefit
    at_measured = at_acceptance(model, row.measured_alpha, SPEC.key).arms[1]
    assert at_measured.tokens_per_s == pytest.approx(SPEC.tokens_per_s)  # calibrated at the measured point


def test_sensitivity_rows_by_hand():
    rows = sensitivity(inputs())
    assert [r.swing for r in rows] == sorted((r.swing for r in rows), reverse=True)
    gpu = next(r for r in rows if r.name == "gpu_hour_usd")
    assert (gpu.low, gpu.high) == pytest.approx((3.2, 4.8))
    assert gpu.net_at_low == pytest.approx(net_benefit(replace(inputs(), prices=PRICES.with_gpu_hour("X", 3.2))))
    pue = next(r for r in rows if r.name == "pue")
    assert pue.low == pytest.approx(1.2) and pue.high == pytest.approx(1.8)
    near_one = sensitivity(inputs(prices=replace(PRICES, pue=1.1)))
    assert next(r for r in near_one if r.name == "pue").low == 1.0  # PUE never below 1
    assert {"acceptance (alpha)", "draft_training_usd", "incident_days_per_week", "tech_debt_buffer"} <= {
        r.name for r in rows
    }
    assert sensitivity(inputs(arms=(SPEC,))) == []


# --- properties ----------------------------------------------------------------------------------

positive = st.floats(0.01, 1e4, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(
    tokens_per_s=positive,
    energy=st.floats(0, 100),
    requests=st.integers(1, 10_000),
    retries=st.integers(0, 10_000),
    more=st.integers(0, 10_000),
    memory=st.floats(0, 200),
)
def test_more_retries_never_lower_cost(tokens_per_s, energy, requests, retries, more, memory):
    arm = replace(
        PLAIN,
        tokens_per_s=tokens_per_s,
        energy_j_per_token=energy,
        requests=requests,
        retries=retries,
        target_memory_bytes=memory * GB,
    )
    base, worse = (arm_cost(replace(arm, retries=r), inputs(), 1e9) for r in (retries, retries + more))
    assert worse.total_usd_per_mtok >= base.total_usd_per_mtok and worse.monthly_usd >= base.monthly_usd


@settings(max_examples=300, deadline=None)
@given(a=st.floats(0, 1), b=st.floats(0, 1), gamma=st.integers(1, 16), c=st.floats(0, 2))
def test_higher_acceptance_never_lowers_speedup(a, b, gamma, c):
    low, high = sorted((a, b))
    assert expected_speedup(high, gamma, c) >= expected_speedup(low, gamma, c) * (1 - 1e-12)


@settings(max_examples=200, deadline=None)
@given(gamma=st.integers(1, 32), c=st.floats(0, 2))
def test_speedup_tends_to_its_limit_as_acceptance_tends_to_one(gamma, c):
    limit = (gamma + 1) / (gamma * c + 1)
    assert expected_speedup(1.0, gamma, c) == pytest.approx(limit)
    for eps in (1e-3, 1e-6, 1e-10):
        assert expected_speedup(1 - eps, gamma, c) == pytest.approx(limit, rel=gamma * eps * 2)


# --- where inputs come from ----------------------------------------------------------------------


def test_shipped_price_table_and_example_file():
    prices = load_prices()
    assert prices.as_of == "2026-11"
    assert set(prices.accelerators) == {"A100-80GB", "H100-SXM", "H200", "L4", "cpu-laptop"}
    assert all(gpu.source and gpu.usd_per_hour > 0 for gpu in prices.accelerators.values())
    example = what_if_inputs(Path(__file__).parents[2] / "cost" / "cost_example.toml", prices)
    assert example.gpu_type == "H100-SXM" and {a.key for a in example.arms} == {
        "autoregressive",
        "speculative:model:llama-68m",
    }
    assert example.hidden.draft_training_usd == 15_000 and example.hidden.monitoring_source == "given"


def test_bad_what_if_file_is_one_line(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[[arms]]\nmode = "autoregressive"\ntokens_per_s = 10\ncolour = "red"\n')
    with pytest.raises(ValueError, match=r"bad.toml: arms.0.colour: Extra inputs are not permitted") as caught:
        what_if_inputs(path, load_prices())
    assert "\n" not in str(caught.value)
    path.write_text("arms = [")
    with pytest.raises(ValueError, match="not valid TOML"):
        what_if_inputs(path, load_prices())


def test_measured_inputs_from_stored_records(db):
    rng = np.random.default_rng(3)
    plain = [  # the engine recorded each one's device time: half a second
        plain_request_dict(
            i,
            e2e_s=float(rng.uniform(1, 2)),
            queue_s=0.1,
            output_tokens=50,
            retries=i % 3,
            energy_j=100.0,
            energy_source="rapl",
            device_s=0.5,
            device_s_source="engine",
        )
        for i in range(20)
    ]
    spec = [  # no device time recorded, one at a time (a second apart, each shorter): all of its life
        request_dict(
            100 + i,
            e2e_s=float(rng.uniform(0.5, 1)),
            queue_s=0.0,
            output_tokens=64,
            draft_s=0.05,
            verify_s=0.4,
            status="error" if i == 0 else "ok",
        )
        for i in range(30)
    ]
    samples = [
        sample_dict(
            i,
            mem_reserved_bytes=4 * GB + i,
            draft_loaded=i % 2 == 0,
            active_requests=1,
            power_w=50.0,
            power_source="estimate",
        )
        for i in range(30)
    ]
    Store(db).insert(IngestBatch.model_validate({"requests": plain + spec, "samples": samples}))
    window = Window(T0 - 100, T0 + 1000)
    got = measured_inputs(db, window, load_prices(), gpu_type="cpu-laptop")
    ar, ng = got.arms
    assert (ar.key, ng.key) == ("autoregressive", "speculative:ngram")
    # a request retried k times: k / (k + 1) of its device time and energy was failed work (its retries line)
    ok_part = [1 / (1 + i % 3) for i in range(20)]
    assert ar.tokens_per_s == pytest.approx(50 * 20 / (0.5 * sum(ok_part))) and ar.device_s_source == "engine"
    assert ar.failed_device_s == pytest.approx(0.5 * (20 - sum(ok_part)))
    ok = spec[1:]
    assert ng.tokens_per_s == pytest.approx(64 * 29 / sum(r["e2e_s"] for r in ok)) and ng.output_tokens == 64 * 29
    assert ng.device_s_source == "derived" and ng.failed_device_s == pytest.approx(spec[0]["e2e_s"])
    assert ng.retry_factor == pytest.approx(spec[0]["e2e_s"] / sum(r["e2e_s"] for r in ok))
    assert ar.retries == sum(i % 3 for i in range(20))
    assert ar.energy_j_per_token == pytest.approx(100 * sum(ok_part) / (50 * 20))  # ok work only
    assert ar.energy_source == "rapl"
    # no metered energy on the speculative requests: the samples' (estimated) power over their device time
    all_spec_s = sum(r["e2e_s"] for r in spec)
    ok_spec_s = sum(r["e2e_s"] for r in ok)  # J per token over ok work: the failed request's energy is a retry's
    assert ng.energy_source == "estimate" and ng.energy_j_per_token == pytest.approx(50.0 * ok_spec_s / (64 * 29))
    # samples with the draft unloaded give the target's memory; n-gram lookup holds none
    assert ar.target_memory_bytes == pytest.approx(np.median([4 * GB + i for i in range(1, 30, 2)]))
    assert ng.draft_memory_bytes == 0.0 and ar.memory_source == "measured"
    assert (ng.drafts, ng.draft_tokens, ng.accepted_tokens) == (116, 464, sum(9 + i % 2 for i in range(101, 130)))
    assert ng.verify_s == pytest.approx(0.4 * 29) and ar.window_s == pytest.approx(T0 + 1000 - T0)
    # up from 5 s before the first sample to the last: 150 s, of which the requests used 10 s + the spec lives
    assert got.idle.up_s == pytest.approx(150.0) and got.idle.busy_s == pytest.approx(10.0 + all_spec_s)
    assert got.hidden.monitoring_source == "measured" and got.hidden.monitoring_gb_per_day > 0
    assert got.hidden.monitoring_gb_per_day == pytest.approx(storage_gb_per_day(db, window))
    assert tco(got).benefits[0].hidden.draft_training_usd == 0.0  # n-gram: nothing to train


def test_draft_memory_from_unload_events(db):
    records = [request_dict(i, drafter="model:tiny") for i in range(5)]
    samples = [sample_dict(i, mem_reserved_bytes=10 * GB) for i in range(5)]
    event = {
        "instance": "gpu-0",
        "at": T0 + 3,
        "kind": "draft_unloaded",
        "detail": {"before": {"reserved": 10 * GB}, "after": {"reserved": 7 * GB}, "freed_rss_bytes": 1},
    }
    Store(db).insert(IngestBatch.model_validate({"requests": records, "samples": samples, "events": [event]}))
    (arm,) = measured_inputs(db, Window(T0 - 1, T0 + 100), load_prices(), gpu_type="L4", measure_storage=False).arms
    assert arm.target_memory_bytes == 7 * GB and arm.draft_memory_bytes == 3 * GB


def test_energy_per_token_from_the_requests_power_readings_cover(db):
    """A request before the first device sample has no power reading: the arm's J/token comes from the others."""
    records = [
        plain_request_dict(i, started_at=T0 + 10 * i, e2e_s=1.0, queue_s=0.0, output_tokens=10) for i in range(5)
    ]
    samples = [sample_dict(i, at=T0 + 15 + 5 * i, power_w=20.0, power_source="estimate") for i in range(10)]
    Store(db).insert(IngestBatch.model_validate({"requests": records, "samples": samples}))
    (arm,) = measured_inputs(db, Window(T0 - 1, T0 + 100), load_prices(), gpu_type="L4", measure_storage=False).arms
    # samples cover T0+10 .. T0+60: requests 1-4 (one second each at 20 W), not request 0 at T0
    assert arm.energy_source == "estimate" and arm.energy_j_per_token == pytest.approx(20.0 * 4 / 40)
