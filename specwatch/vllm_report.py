"""What `specwatch vllm check` prints at the end: everything read back from the collector
(and, to check it, from vLLM's own /metrics).

The A/B check (`print_ab_report`): per arm the requests, acceptance and latency; the speed-up per
scenario with its p-value; the spec arm's acceptance by draft position from the records, checked
against the delta of the speculating vLLM's own counters; the cost per arm.

The single-server check (`print_report`), per traffic phase:

- acceptance the collector reports for the vLLM source vs the delta of vLLM's counters,
- TTFT / e2e percentiles (vLLM's histograms, as scraped) next to the client-side ones,
- the scrape timeline (gaps, counter resets) and the robustness verdicts,
- alerts (pending / firing, transitions, rule health),
- the TCO of the vLLM source (cost.model over the measured phases; priced on `cpu-laptop`).
"""

from __future__ import annotations

import time

import httpx
from sqlalchemy import create_engine

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
    from specwatch.collector.reads.reads import vllm_scrapes

    db = create_engine(run.db_url)
    rows = vllm_scrapes(db)
    db.dispose()
    if not rows:
        print("\nscrape timeline: no rows stored")
        return
    t0 = rows[0].at - rows[0].interval_s
    print(f"\nscrape timeline ({len(rows)} rows; t = seconds since the first scrape; quiet rows folded):")
    print(
        f"  {'t':>6} {'interval':>8} {'reset':>5} {'drafts':>7} {'drafted':>8} {'accepted':>8} "
        f"{'TTFT n':>6} {'e2e n':>6}"
    )
    quiet = 0
    for r in rows:
        gap = r.interval_s > GAP_S
        busy = r.drafts or sum(r.ttft_counts) or sum(r.e2e_counts)
        if not (busy or gap or r.counter_reset):
            quiet += 1
            continue
        if quiet:
            print(f"  {'':>6} ({quiet} quiet rows)")
            quiet = 0
        flag = "  <- gap" if gap else ""
        print(
            f"  {r.at - t0:6.1f} {r.interval_s:8.1f} {'yes' if r.counter_reset else '':>5} {r.drafts:7.0f} "
            f"{r.draft_tokens:8.0f} {r.accepted_tokens:8.0f} "
            f"{sum(r.ttft_counts):6.0f} {sum(r.e2e_counts):6.0f}{flag}"
        )
    if quiet:
        print(f"  {'':>6} ({quiet} quiet rows)")
    _robustness(run, rows)


def _robustness(run, rows) -> None:
    if len(run.phases) < 2:
        return
    restart = run.phases[1]
    after = [r for r in rows if r.at > run.phases[0].settled]
    resets = [r for r in after if r.counter_reset]
    gaps = [r for r in after if r.interval_s > GAP_S]
    negative = [
        r for r in rows if min([r.drafts, r.draft_tokens, r.accepted_tokens, *r.ttft_counts, *r.e2e_counts]) < 0
    ]
    own_requests = restart.rows[0]["requests"]
    seen_requests = sum(sum(r.e2e_counts) for r in after)
    drafts_after = sum(r.drafts for r in after)
    print("\nscraper robustness (vLLM stopped, down for a few scrapes, restarted with speculation off):")
    spans = ", ".join(f"{g.interval_s:.1f} s" for g in gaps) or "-"
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
    from specwatch.cost.inputs import load_prices
    from specwatch.cost.model import CostInputs, ModeMeasure
    from specwatch.cost.summary import render_text, summarize

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


# -- the A/B check (specwatch.vllm_ab) -----------------------------------------------------------------

PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def per_position_totals(metrics_text: str) -> dict[int, float]:
    """vLLM's accepted tokens per draft position (0-based; `position` label), summed over engines."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[int, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name == PER_POSITION:
            for sample in family.samples:
                if sample.name == PER_POSITION + "_total":
                    position = int(sample.labels["position"])
                    totals[position] = totals.get(position, 0.0) + sample.value
    return totals


def spec_counters(metrics_url: str) -> dict:
    """vLLM's spec-decode counter totals, and `per_position`: {position: accepted tokens}."""
    from specwatch.gateway.vllm_server import SPEC_COUNTERS, counter_totals

    text = httpx.get(metrics_url, timeout=10).text
    return {**counter_totals(text, SPEC_COUNTERS), "per_position": per_position_totals(text)}


def print_ab_report(run) -> bool:
    """The A/B summary from the collector's query API; True when the records match vLLM's counters
    and no request failed."""
    print("\n" + "=" * 100 + "\nvllm check (A/B through the gateway): summary\n" + "=" * 100, flush=True)
    window = {"start": run.started - 1, "end": run.ended + 60}
    arms = _get(run, "/v1/breakdown", {**window, "by": "arm"})["groups"]
    print(
        f"{run.ended - run.started:.0f} s of `specwatch traffic` through the gateway (canary {run.args.canary:g}): "
        f"{run.requests} requests; arm spec = vLLM with n-gram speculation, arm control = plain vLLM"
    )
    _arms(arms)
    _speedups(run, window)
    matches = _acceptance(run, window)
    _cost(run, window)
    errors = sum(g["errors"] for g in arms)
    ok = matches and errors == 0 and {g["key"] for g in arms} == {"spec", "control"}
    verdict = "PASS" if ok else "FAIL"
    print(
        f"\nvllm check: {verdict}: both arms served, {errors} errors; the records' draft counts "
        f"{'equal' if matches else 'differ from'} the speculating vLLM's own counters",
        flush=True,
    )
    return ok


def _get(run, path: str, params: dict) -> dict:
    response = httpx.get(run.collector_url + path, params=params, timeout=30)
    response.raise_for_status()
    return response.json()


def _arms(groups: list[dict]) -> None:
    print("\narms (GET /v1/breakdown?by=arm):")
    print(
        f"  {'arm':<8} {'requests':>8} {'errors':>6} {'tokens':>7} {'acceptance':>10} {'accept len':>10} "
        f"{'ms/token':>9} {'TTFT P50':>9} {'TTFT P99':>9}"
    )
    for g in groups:
        print(
            f"  {g['key']:<8} {g['requests']:>8} {g['errors']:>6} {g['output_tokens']:>7} "
            f"{_ratio(g['acceptance_rate']):>10} {_ratio(g['mean_acceptance_length']):>10} "
            f"{_ms_value(g['s_per_token_mean']):>9} {_ms(g['ttft']['p50']):>9} {_ms(g['ttft']['p99']):>9}"
        )


def _speedups(run, window: dict) -> None:
    print(
        "\nspeed-up per scenario (GET /v1/compare?by=arm&tag=scenario:S): control mean s/token over spec "
        "mean s/token (> 1: speculation pays), two-sided Mann-Whitney U p-value on the per-request s/token"
    )
    print(
        f"  {'scenario':<10} {'spec n':>6} {'control n':>9} {'spec ms/tok':>11} {'ctrl ms/tok':>11} {'speed-up':>8}  p"
    )
    for scenario in (*run.scenarios, None):
        tags = {"tag": f"scenario:{scenario}"} if scenario else {}
        got = _get(run, "/v1/compare", {**window, "by": "arm", **tags})
        spec, plain = got["speculative"] or {}, got["plain"] or {}
        speedup = "n/a" if got["speedup"] is None else f"{got['speedup']:.2f}x"
        p_value = "n/a" if got["p_value"] is None else f"{got['p_value']:.3g}"
        print(
            f"  {scenario or 'all':<10} {spec.get('requests', 0):>6} {plain.get('requests', 0):>9} "
            f"{_ms_value(spec.get('s_per_token_mean')):>11} {_ms_value(plain.get('s_per_token_mean')):>11} "
            f"{speedup:>8}  {p_value}"
        )


def _acceptance(run, window: dict) -> bool:
    """Acceptance of the spec arm from the records, and whether it equals vLLM's own counter deltas."""
    signals = _get(run, "/v1/signals", {**window, "arm": "spec"})
    positions = _get(run, "/v1/acceptance/positions", {**window, "arm": "spec"})
    before, after = run.counters_before, run.counters_after
    own = [after[name] - before[name] for name, _ in COUNTER_FIELDS]
    seen = [signals[short] for _, short in COUNTER_FIELDS]
    by_records = [round(rate * positions["drafts"]) for rate in positions["rates"]]
    width = max(len(by_records), len(after["per_position"]))
    by_counters = [round(after["per_position"].get(i, 0) - before["per_position"].get(i, 0)) for i in range(width)]
    by_records += [0] * (width - len(by_records))
    equal = seen == own and by_records == by_counters
    print(
        f"\nacceptance of the spec arm (the records: GET /v1/signals?arm=spec): {_ratio(signals['acceptance_rate'])} "
        f"= {seen[2]} accepted / {seen[1]} drafted tokens in {seen[0]} drafts, "
        f"mean acceptance length {_ratio(signals['mean_acceptance_length'])}"
    )
    print(
        "  by draft position (GET /v1/acceptance/positions: share of drafts with tokens 0..i all accepted): "
        + " ".join(f"{rate:.2f}" for rate in positions["rates"])
    )
    print(
        f"  the speculating vLLM's own counters, delta over the traffic: {own[2]:.0f} accepted / {own[1]:.0f} "
        f"drafted, {own[0]:.0f} drafts; per position {by_counters} vs the records' {by_records} -> "
        f"{'EQUAL' if equal else 'DIFFERENT'}"
    )
    return equal


def _cost(run, window: dict) -> None:
    got = _get(run, "/v1/cost", {**window, "gpu_type": GPU_TYPE})
    tco = got["tco"]
    print(
        f"\ncost per arm (GET /v1/cost over the window, priced as {GPU_TYPE} at ${tco['gpu_hour_usd']:g}/h, "
        f"{tco['monthly_output_tokens'] / 1e6:.1f}M output tokens/month {tco['volume_source']}):"
    )
    print(f"  {'arm':<24} {'USD / 1M tokens':>15} {'device-h / 1M':>13} {'USD / month':>11}")
    for arm in tco["arms"]:
        print(
            f"  {arm['key']:<24} {arm['total_usd_per_mtok']:>15.4f} {arm['gpu_hours_per_mtok']:>13.3f} "
            f"{arm['monthly_usd']:>11.2f}"
        )
    for benefit in tco["benefits"]:
        print(
            f"  speculation ({benefit['key']}): saves ${benefit['explicit_saving_usd']:.2f}/month explicitly, "
            f"net ${benefit['net_usd']:.2f}/month after hidden costs"
        )


def _ms_value(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{1000 * seconds:.1f}"
