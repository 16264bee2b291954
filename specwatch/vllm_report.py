"""What `specwatch vllm check` prints at the end: everything read back from the collector
(and, to check it, from vLLM's own /metrics), per traffic phase.

- acceptance the collector reports for the vLLM source vs the delta of vLLM's counters,
- TTFT / e2e percentiles (vLLM's histograms, as scraped) next to the client-side ones,
- the scrape timeline (gaps, counter resets) and the robustness verdicts,
- alerts (pending / firing, transitions, rule health),
- the TCO of the vLLM source (cost.model over the measured phases; priced on `cpu-laptop`).
"""

from __future__ import annotations

import time

import httpx
from sqlalchemy import create_engine, select

COUNTER_FIELDS = (
    ("vllm:spec_decode_num_drafts", "drafts"),
    ("vllm:spec_decode_num_draft_tokens", "draft_tokens"),
    ("vllm:spec_decode_num_accepted_tokens", "accepted_tokens"),
)
GPU_TYPE = "cpu-laptop"
SCRAPE_S = 2.0  # as specwatch.vllm_check sets it
GAP_S = 2.5 * SCRAPE_S  # a row spanning more than this covers failed scrapes


def print_report(run) -> None:
    print("\n" + "=" * 100 + "\nvllm check: summary\n" + "=" * 100, flush=True)
    ends = [p.started for p in run.phases[1:]] + [None]
    verdicts = [_phase(run, phase, end) for phase, end in zip(run.phases, ends)]
    _timeline(run)
    _alerts(run)
    _tco(run)
    ok = all(verdicts)
    print(
        f"\nvllm check: {'PASS' if ok else 'FAIL'}: specwatch's figures for the vLLM source "
        f"{'equal' if ok else 'differ from'} vLLM's own counters in every phase",
        flush=True,
    )


def _signals(run, start: float, end: float | None) -> dict:
    params = {"start": start, "end": end or time.time() + 60, "source": run.server.metrics_url}
    return httpx.get(f"{run.collector_url}/v1/vllm/signals", params=params, timeout=10).json()


def _phase(run, phase, end: float | None) -> bool:
    got = _signals(run, phase.started, end)
    own = {
        short: phase.counters_after.get(name, 0.0) - phase.counters_before.get(name, 0.0)
        for name, short in COUNTER_FIELDS
    }
    seen = {short: got[short] for _, short in COUNTER_FIELDS}
    equal = all(abs(seen[k] - own[k]) < 1e-6 for k in own)
    print(
        f"\n[{phase.name}]  {phase.ended - phase.started:.0f} s of traffic, "
        f"{phase.generation_tokens:.0f} output tokens "
        f"(vllm:generation_tokens_total), {phase.generation_tokens / (phase.ended - phase.started):.1f} tok/s"
    )
    print(
        f"  acceptance  specwatch (vLLM source): {_ratio(got['acceptance_rate'])}  "
        f"= {seen['accepted_tokens']:.0f} accepted / {seen['draft_tokens']:.0f} drafted tokens, "
        f"{seen['drafts']:.0f} drafts, "
        f"mean acceptance length {_ratio(got['mean_acceptance_length'])}"
    )
    own_rate = own["accepted_tokens"] / own["draft_tokens"] if own["draft_tokens"] else None
    print(
        f"              vLLM's own counters, delta: {_ratio(own_rate)}  "
        f"= {own['accepted_tokens']:.0f} / {own['draft_tokens']:.0f}, {own['drafts']:.0f} drafts  -> "
        f"{'EQUAL' if equal else 'DIFFERENT'}"
    )
    if got["per_position"]:
        print("              per position: " + " ".join(f"{p:.2f}" for p in got["per_position"]))
    print(f"  spec-decode families on vLLM's /metrics: {'present' if phase.spec_families else 'absent'}")
    client = phase.rows[0]
    ttft, e2e = got["ttft"], got["e2e"]
    print(
        f"  TTFT (vLLM histogram, scraped)  P50 {_ms(ttft['p50'])}  P90 {_ms(ttft['p90'])}  P99 {_ms(ttft['p99'])}  "
        f"over {ttft['count']} requests;  client-side P50 {_ms(client['ttft_p50_s'])}  P99 {_ms(client['ttft_p99_s'])}"
    )
    print(
        f"  e2e  (vLLM histogram, scraped)  P50 {_ms(e2e['p50'])}  P99 {_ms(e2e['p99'])};  "
        f"client-side P50 {_ms(client['e2e_p50_s'])}  P99 {_ms(client['e2e_p99_s'])};  "
        f"{client['requests']} requests, {client['errors']} errors"
    )
    return equal and client["errors"] == 0


def _timeline(run) -> None:
    """Every stored scrape row: quiet ones folded, gaps and resets spelled out."""
    from collector.models import VllmScrape

    engine = create_engine(run.db_url)
    with engine.connect() as conn:
        rows = conn.execute(select(VllmScrape).order_by(VllmScrape.at)).mappings().all()
    engine.dispose()
    if not rows:
        print("\nscrape timeline: no rows stored")
        return
    t0 = rows[0]["at"] - rows[0]["interval_s"]
    print(f"\nscrape timeline ({len(rows)} rows; t = seconds since the first scrape; quiet rows folded):")
    print(
        f"  {'t':>6} {'interval':>8} {'reset':>5} {'drafts':>7} {'drafted':>8} {'accepted':>8} "
        f"{'TTFT n':>6} {'e2e n':>6}"
    )
    quiet = 0
    for r in rows:
        gap = r["interval_s"] > GAP_S
        busy = r["drafts"] or sum(r["ttft_counts"]) or sum(r["e2e_counts"])
        if not (busy or gap or r["counter_reset"]):
            quiet += 1
            continue
        if quiet:
            print(f"  {'':>6} ({quiet} quiet rows)")
            quiet = 0
        flag = "  <- gap" if gap else ""
        print(
            f"  {r['at'] - t0:6.1f} {r['interval_s']:8.1f} {'yes' if r['counter_reset'] else '':>5} {r['drafts']:7.0f} "
            f"{r['draft_tokens']:8.0f} {r['accepted_tokens']:8.0f} "
            f"{sum(r['ttft_counts']):6.0f} {sum(r['e2e_counts']):6.0f}{flag}"
        )
    if quiet:
        print(f"  {'':>6} ({quiet} quiet rows)")
    _robustness(run, rows)


def _robustness(run, rows) -> None:
    if len(run.phases) < 2:
        return
    restart = run.phases[1]
    after = [r for r in rows if r["at"] > run.phases[0].settled]
    resets = [r for r in after if r["counter_reset"]]
    gaps = [r for r in after if r["interval_s"] > GAP_S]
    negative = [
        r
        for r in rows
        if min([r["drafts"], r["draft_tokens"], r["accepted_tokens"], *r["ttft_counts"], *r["e2e_counts"]]) < 0
    ]
    own_requests = restart.rows[0]["requests"]
    seen_requests = sum(sum(r["e2e_counts"]) for r in after)
    drafts_after = sum(r["drafts"] for r in after)
    print("\nscraper robustness (vLLM stopped, down for a few scrapes, restarted with speculation off):")
    spans = ", ".join(f"{g['interval_s']:.1f} s" for g in gaps) or "-"
    print(f"  gap recorded: {len(gaps)} row(s) spanning {spans} (scrapes every {SCRAPE_S:g} s)")
    print(f"  counter reset detected: {len(resets)} row(s) flagged")
    print(
        f"  requests after the restart: vLLM served {own_requests}, scraped e2e histogram counts {seen_requests:.0f} "
        f"-> {'no bogus deltas' if seen_requests == own_requests else 'MISMATCH'}"
    )
    print(
        f"  spec-decode families absent after the restart: drafts scraped {drafts_after:.0f} (expected 0); "
        f"negative deltas anywhere: {len(negative)}"
    )


def _alerts(run) -> None:
    body = httpx.get(f"{run.collector_url}/v1/alerts", timeout=10).json()
    start = run.phases[0].started - 300
    history = httpx.get(
        f"{run.collector_url}/v1/alerts/history", params={"start": start, "end": time.time() + 60}, timeout=10
    ).json()
    print(f"\nalerts (GET /v1/alerts): {len(body['alerts'])} pending or firing")
    for a in body["alerts"]:
        print(f"  {a['state']:<8} {a['rule']:<22} value {a['value']:.3f}  {a['annotations'].get('summary', '')}")
    vllm_rules = [h for h in body["rules"] if h["rule"].startswith("Vllm")]
    for h in vllm_rules:
        print(
            f"  rule {h['rule']}: evaluated, {'error ' + h['error'] if h['error'] else 'ok'} "
            f"({1000 * h['duration_s']:.0f} ms)"
        )
    transitions = [t for t in history["transitions"] if t["rule"].startswith("Vllm")]
    for t in reversed(transitions):
        print(f"  transition {t['rule']}: {t['from_state']} -> {t['to_state']} (value {t['value']:.3f})")


def _tco(run) -> None:
    """The cost model over the vLLM phases: n-gram speculation vs plain decoding on the same server."""
    from cost.inputs import load_prices
    from cost.model import CostInputs, ModeMeasure
    from cost.summary import render_text, summarize

    arms = []
    ends = [p.started for p in run.phases[1:]] + [None]
    for phase, end in zip(run.phases, ends):
        got = _signals(run, phase.started, end)
        seconds = phase.ended - phase.started
        arms.append(
            ModeMeasure(
                mode="speculative" if phase.speculative else "autoregressive",
                drafter="ngram" if phase.speculative else None,
                requests=phase.rows[0]["requests"],
                output_tokens=int(phase.generation_tokens),
                window_s=seconds,
                tokens_per_s=max(phase.generation_tokens, 1.0) / seconds,
                drafts=int(got["drafts"]),
                draft_tokens=int(got["draft_tokens"]),
                accepted_tokens=int(got["accepted_tokens"]),
            )
        )
    summary = summarize(CostInputs(tuple(arms), load_prices(), gpu_type=GPU_TYPE), source="measured")
    print(
        f"\nTCO of the vLLM source: cost.model over the {len(arms)} phase(s) above as measured inputs "
        f"(tokens/s = vllm:generation_tokens_total / traffic seconds; acceptance from the scrapes), "
        f"priced as {GPU_TYPE}:"
    )
    text = render_text(summary).replace(
        "(what-if inputs)", f"({sum(a.window_s for a in arms):.0f} s of vLLM traffic measured)"
    )
    print("\n".join("  " + line for line in text.splitlines()))


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{1000 * value:.0f} ms"
