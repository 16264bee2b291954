"""Acceptance: where and why drafts are accepted or not."""

import streamlit as st

from specwatch.dashboard import charts, reads
from specwatch.dashboard.formats import as_markdown_text, p_is
from specwatch.dashboard.state import empty_state, fmt, table, view

v = view()
st.title("Acceptance")
over_time = reads.acceptance_series(v)
if over_time.empty or not over_time["draft_tokens"].sum():
    empty_state(
        "No speculative requests in this window: nothing was drafted. Try a longer window or "
        "`specwatch traffic --drafter ngram`."
    )
    st.stop()
lines = reads.thresholds()
floor = lines.get("acceptance_rate")

st.altair_chart(
    charts.line(
        over_time,
        "acceptance_rate",
        "acceptance rate",
        floor,
        band=("band_low", "band_high"),
        markers=reads.deploy_markers(v),
    ),
    width="stretch",
)
st.caption(
    "Line: accepted / drafted tokens per step. Band: mean ± 1 stddev of per-request acceptance. "
    "Dotted verticals: deploy markers (config events: version, model, drafter changes). "
    + lines.caption("acceptance_rate", "acceptance")
)

defs = reads.acceptance_definitions(v)
overall = defs.overall
st.subheader("Acceptance by definition")
mean, first, ratio, length = st.columns([1, 1.45, 1.15, 1])  # room for each label at 1,280 px
mean.metric("Acceptance rate (mean)", fmt(overall["acceptance_rate"], digits=3))
first.metric("Conditional acceptance (position 0)", fmt(overall["conditional_acceptance"], digits=3))
ratio.metric(
    "Acceptance length / (k + 1)",
    fmt(overall["acceptance_length_ratio"], digits=3) if overall["k"] else "per k, below",
)
length.metric("Mean acceptance length", fmt(overall["mean_acceptance_length"], digits=2))
st.caption(
    f"Over the {overall['requests']:,} requests that drafted (k = {defs.ks})"
    + (f", a sample of {defs.sampled}" if defs.sampled else "")
    + ". **Acceptance rate** (the mean): accepted / drafted tokens; it falls as k grows, since a later position "
    "needs every earlier one accepted. **Conditional acceptance** (position 0): drafts whose first token was "
    "accepted / drafts; the same meaning at every k. **Acceptance length / (k + 1)**: the share of the k + 1 "
    "tokens a drafting step could yield that it did. Definitions: docs/glossary.md."
)
if len(defs.by_k) > 1:
    table(defs.by_k)
for line in defs.flagged:
    st.warning(line)
st.markdown("**Which definition each threshold uses**")
if defs.rules.empty:
    st.caption("No acceptance rule is set in the collector (alerting is off there).")
else:
    table(defs.rules)
    st.caption(
        "To put the 0.6 rule on position 0 instead of the mean, give it `signal: conditional_acceptance` in "
        'your rules file (docs/glossary.md, "which definition each threshold uses").'
    )

left, right = st.columns(2)
with left:
    st.subheader("Per draft position")
    st.altair_chart(
        charts.bars(reads.positions(v), "position", "acceptance", "draft position", "accepted through position"),
        width="stretch",
    )
with right:
    st.subheader("By drafter")
    by_drafter = reads.breakdown(v, "drafter")
    st.altair_chart(
        charts.bars(
            by_drafter.dropna(subset=["acceptance_rate"]),
            "group",
            "acceptance_rate",
            "drafter",
            "acceptance rate",
            floor,
        ),
        width="stretch",
    )

st.subheader("Slices that lost acceptance")
lost = reads.lost_slices(v)
for drafter, slices in lost.by_drafter.items():
    st.markdown(f"**{as_markdown_text(drafter)}**")
    table(slices)
if not lost.by_drafter:
    st.caption(f"No slice lost acceptance against the window before ({lost.tested:,} slices tested).")
rule = lost.settings
st.caption(
    "A slice is one drafter's requests of one tenant, scenario and prompt-length band, compared with the same "
    f"slice in the window before this one (as long). Tested: {lost.tested:,} slices with at least "
    f"{rule.get('min_requests', 0):,} requests that drafted on each side ({lost.untested:,} had fewer"
    + (f"; read from a sample of {lost.sampled}" if lost.sampled else "")
    + "). Test: one-sided Mann-Whitney U on per-request acceptance, the p-values adjusted for the slices tested "
    f"together (Benjamini-Hochberg q). Lost: q < {rule.get('alpha', 0):g} and acceptance fell. "
    f"**Retrain candidate**: at least {rule.get('min_captures', 0):,} stored chat captures of the slice (counted "
    "here; their text needs the admin token). The export command writes them as a training set for "
    "`specwatch draft train` or speculators (admin token in SPECWATCH_ADMIN_TOKEN)."
    + (" The collector returned only the first slices." if lost.truncated else "")
)

for by, label in (("prompt_tokens", "prompt length"), ("output_tokens", "output length")):
    found = reads.length_points(v, by)
    within = reads.length_within_scenarios(v, by)
    st.subheader(f"Acceptance vs {label}")
    overall = (
        f"Spearman ρ = {fmt(found.rho, digits=3)} ({p_is(found.p_value)}) over {found.requests:,} requests that drafted"
    )
    if len(within) > 1:
        st.caption(
            f"{overall}, all scenarios together: **confounded** (scenarios differ in both {label} and "
            "acceptance). Within each scenario:"
        )
        table(within)
    elif v.tag or len(within):
        st.caption(f"{overall}, within {as_markdown_text(v.tag or 'scenario:' + within['scenario'][0])}")
    else:
        st.caption(f"{overall} (no scenario tags: it may mix kinds of traffic)")
    left, right = st.columns(2)
    left.altair_chart(
        charts.scatter(found.points, "length", "acceptance", f"{label} (tokens)", "acceptance rate"), width="stretch"
    )
    right.altair_chart(
        charts.bars(
            found.buckets.dropna(subset=["acceptance_rate"]),
            "bucket",
            "acceptance_rate",
            f"{label} (tokens)",
            "acceptance rate",
            floor,
        ),
        width="stretch",
    )

st.subheader("By scenario")
table(reads.breakdown(v, "tag:scenario"))
