"""Cost: what speculation costs per token and per month, when it pays, and what to do."""

import streamlit as st

from specwatch.dashboard import charts, cost_service, reads
from specwatch.dashboard.formats import as_markdown_text, usd
from specwatch.dashboard.state import empty_state, fmt, table, this_month, verdict_panel, view

PRICINGS = ("on-demand", "spot", "reserved", "on-prem")
IDLE = ("separate", "weighted", "even")
HIDDEN_KNOBS = (
    "draft_training_usd",
    "amortisation_months",
    "incident_days_per_week",
    "tech_debt_buffer",
    "opportunity_days_per_month",
)

v = view()
st.title("Cost")
base = reads.cost(v).summary
prices = base["inputs"]["prices"]
with st.expander("Prices and volumes (what-if)", expanded=False):
    gpus = list(prices["accelerators"])
    gpu = st.selectbox(
        "Accelerator", gpus, index=gpus.index(base["tco"]["gpu_type"]) if base["tco"]["gpu_type"] in gpus else 0
    )
    hidden = base["inputs"]["hidden"]
    defaults = {
        "gpu_hour_usd": float(prices["accelerators"][gpu]["usd_per_hour"]),
        "electricity_usd_per_kwh": float(prices["electricity_usd_per_kwh"]),
        "pue": float(prices["pue"]),
        "monthly_output_tokens": float(base["tco"]["monthly_output_tokens"] or 0.0),
        **{k: float(hidden[k]) for k in HIDDEN_KNOBS},
        "pricing": base["tco"]["pricing"],
        "idle_allocation": (base["tco"]["idle"] or {}).get("allocation", "separate"),
    }
    cols = st.columns(4)
    edits = {
        "gpu_hour_usd": cols[0].number_input("GPU $/hour", 0.0, value=defaults["gpu_hour_usd"]),
        "electricity_usd_per_kwh": cols[1].number_input(
            "Electricity $/kWh", 0.0, value=defaults["electricity_usd_per_kwh"]
        ),
        "pue": cols[2].number_input("PUE", 1.0, value=defaults["pue"]),
        "monthly_output_tokens": cols[3].number_input(
            "Output tokens / month", 0.0, value=defaults["monthly_output_tokens"], format="%.0f"
        ),
        "draft_training_usd": cols[0].number_input("Draft training $", 0.0, value=defaults["draft_training_usd"]),
        "amortisation_months": cols[1].number_input(
            "Amortised over (months)", 1.0, value=defaults["amortisation_months"]
        ),
        "incident_days_per_week": cols[2].number_input(
            "Incident person-days / week", 0.0, value=defaults["incident_days_per_week"]
        ),
        "tech_debt_buffer": cols[3].number_input("Tech-debt reserve", 0.0, 10.0, value=defaults["tech_debt_buffer"]),
        "opportunity_days_per_month": cols[0].number_input(
            "Opportunity engineer-days / month", 0.0, value=defaults["opportunity_days_per_month"]
        ),
        "pricing": cols[1].selectbox("Pricing", PRICINGS, index=PRICINGS.index(defaults["pricing"])),
        "idle_allocation": cols[2].selectbox(
            "Idle time",
            IDLE,
            index=IDLE.index(defaults["idle_allocation"]),
            help="its own line, or split over the arms",
        ),
    }
    st.caption(f"Price table as of {prices['as_of']} (cost/prices.toml); edit it for your contract prices.")
# only what the user changed goes to the API: an unchanged default keeps its source (and its estimate mark)
changed = tuple(sorted((k, value) for k, value in edits.items() if value != defaults[k]))
model = reads.cost(v, gpu if gpu != base["tco"]["gpu_type"] else None, changed)
summary = model.summary
if model.arms.empty:
    empty_state()
    st.stop()
verdict_panel(summary.get("verdict"))
judged = summary.get("verdict") or {}
per_mtok = {a["key"]: a["total_usd_per_mtok"] for a in summary["tco"]["arms"]}
cols = st.columns(4)
cols[0].metric(
    f"{as_markdown_text(summary['tco']['primary'] or 'speculative')} $ / 1M tokens",
    usd(per_mtok.get(summary["tco"]["primary"]), "no speculative requests"),
)
cols[1].metric("Plain $ / 1M tokens", usd(per_mtok.get("autoregressive"), "no plain requests"))
cols[2].metric(
    "Saving / month (measured)",
    usd(judged.get("saving_usd_per_month"), "needs plain and speculative requests"),
    help="(plain - speculative) $ per 1M tokens x the monthly volume; negative: speculation costs more",
)
estimate = "~" if judged.get("fixed_estimate") else ""
cols[3].metric(
    "Pays its fixed costs above" + (" (estimate)" if estimate else ""),
    estimate + fmt(judged.get("break_even_tokens_per_month"), " tokens/month", digits=0, missing="never"),
    help="fixed costs / month (draft training, monitoring, incidents, opportunity, reserve) / saving per token",
)
priced = f"{summary['tco']['gpu_type']} ({summary['tco']['pricing']})"
bill = cost_service.window_bill(summary)
if bill is not None:
    mark = "~" if bill.estimate else ""
    st.subheader(f"The bill for this window: {mark}{as_markdown_text(usd(bill.usd))}" + (" (estimate)" if mark else ""))
    st.altair_chart(charts.bill_stack(bill.parts), width="stretch")
    st.caption(
        "Σ instance price x hours in the window; the parts add up to it. "
        + ("~: some part is an estimate (hover a part)." if mark else "")
    )
st.subheader(f"Cost per 1M output tokens on {as_markdown_text(priced)}")
table(model.arms)
idle = summary["tco"]["idle"]
if idle is None:
    st.caption("Idle device time: not measured (no device samples in the window).")
else:
    how = "spread over the arms by device time" if idle["allocation"] == "by_share" else "its own line"
    st.caption(
        f"Idle device time: {idle['idle_fraction']:.0%} of {idle['up_s']:,.0f} s up, "
        f"{usd(idle['monthly_usd'])} / month ({how})."
    )
for note in dict.fromkeys(summary["tco"]["notes"] + summary["notes"]):  # each note once
    st.caption(f"⚠️ {as_markdown_text(note)}" if "estimate" in note else as_markdown_text(note))

st.subheader("Cost per 1M output tokens against concurrency")
if model.concurrency.empty:
    st.info("No requests with both modes to place by concurrency in this window.")
else:
    st.altair_chart(charts.cost_by_concurrency(model.concurrency, model.crossover), width="stretch")
    crossing = model.crossover
    st.caption(
        "Speculation costs more from concurrency "
        + (f"{crossing} (dashed line) on." if crossing else "— never, within the levels measured.")
        + " Each request is placed at the mean number of requests in flight during its life (nearest power of two)."
    )

st.subheader("Cost per 1M output tokens, day by day")
days = st.selectbox("Days", (7, 30, 90), index=1, key="cost_days")
daily = reads.cost_daily(days)
if daily.rows.empty:
    st.info(f"No arm served requests in the last {days} days.")
else:
    st.altair_chart(charts.daily_cost(daily.rows), width="stretch")
    priced_on = as_markdown_text(f"{daily.gpu_type} ({daily.gpu_type_source})")
    st.caption(f"All instances, priced on {priced_on}; each UTC day on its own.")
    for note in daily.notes:
        st.caption(f"⚠️ estimate: {as_markdown_text(note)}")

st.subheader("Does speculation pay? (monthly, hidden costs included)")
if model.benefits.empty:
    st.info("Both speculative and autoregressive requests are needed to price the difference.")
else:
    table(model.benefits)

left, right = st.columns(2)
with left:
    st.subheader("Break-even")
    curves = model.curves.dropna(subset=["speed-up"])
    if curves.empty:
        st.info("No draft/verify timings in this window to model the speed-up curve.")
    else:
        measured = [(b["key"], b["measured_alpha"]) for b in summary["break_even"] if b["measured_alpha"] is not None]
        st.altair_chart(charts.break_even(curves, measured), width="stretch")
        for b in summary["break_even"]:
            st.caption(
                f"{as_markdown_text(b['key'])}: speculation stops paying below acceptance α = "
                f"{fmt(b['speedup_alpha'], digits=3)} (speed-up) / {fmt(b['benefit_alpha'], digits=3)} (net "
                f"benefit); measured α = {fmt(b['measured_alpha'], digits=3)} ({as_markdown_text(b.get('source', ''))})"
            )
            times_from = as_markdown_text(b.get("times_from") or "n/a")
            st.caption(f"step times from: **{times_from}** · {cost_service.step_times(b)}")
            for warning in b.get("warnings", []):
                st.caption(f"⚠️ {as_markdown_text(warning)}")
with right:
    st.subheader("Sensitivity (±20%)")
    if model.tornado.empty:
        st.info("No net benefit to vary.")
    else:
        st.altair_chart(charts.tornado(model.tornado), width="stretch")

st.subheader("Assumptions")
st.caption(
    "Every input of the model, its value and where it came from; 'default (seed)' and 'estimate' are not measured."
)
table(model.assumptions)

st.subheader("Recommendations per scenario")
table(model.advice[["scenario", "action", "sentence"]] if not model.advice.empty else model.advice)

st.subheader("Monthly cost-benefit report")
month = st.text_input("Month (YYYY-MM)", value=this_month(), max_chars=7)
if st.button("Build the report"):
    st.download_button(
        f"Download specwatch-report-{month}.html",
        reads.report_html(month),
        file_name=f"specwatch-report-{month}.html",
        mime="text/html",
    )
