"""The tuner's curves from stored records (`collector.reads.tuning_reads`), or a step-cost profile.

Buckets are the cost model's concurrency levels: each request's life is split over the levels it ran
at, time-weighted (`cost.attribution.level_fractions`, as the cost-against-concurrency table does),
and its counts go to each level in that proportion (weight w).

    acceptance   a_i = Σ w·accepted_per_position[i] / Σ w·drafts reaching i: the record's
                 drafts_per_position[i] where the producer counted it (vLLM `detailed`: its per-step
                 drafted counts), else every draft taken to reach the request's gamma (vLLM `summary`:
                 its acceptance_histogram); the source names which. q = Σ w·drafts / Σ w·steps, steps =
                 output_tokens - 1 - accepted (the forwards after the first token).
    step cost    per level, one point per (mode, gamma): x = Σ w·draft_tokens / Σ w·steps (draft tokens
                 verified per step), y = Σ w·decode seconds / Σ w·steps. Decode seconds are the
                 producer's recorded forward time (verify_s + draft_s: the bundled engine) when it has
                 one, else the decode wall time e2e_s - ttft_s (a gateway's records of vLLM); requests
                 with neither are left out. A level needs two points whose x differ by >= MIN_SPREAD.
    profile      {"levels": {"<batch>": {"<k>": seconds, ...}}, "source": "..."}: those levels' curves
                 replace the records' (source "profile: ..."). `specwatch tune profile` adds "made_at"
                 (epoch s), "upstream_version" (the servers' /version) and "acceptance": {"<batch>":
                 {"rates": [a_0, ...], "draft_rate": q, "requests": n, "drafts": d}}, which a level uses
                 when its records have too little (`TuneRules.min_requests` / `min_drafts`); a profile's
                 date and version date the schedule when no record does.
    intervals    95% percentile bootstrap (scipy) of tokens/s per k, the bucket's requests resampled:
                 they carry the acceptance data's uncertainty, not the step cost's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from specwatch.collector.reads.tuning_reads import TuningRows
from specwatch.cost.attribution import Spans, level_fractions
from specwatch.cost.tuner import Acceptance, Interval, Schedule, StepCurve, TuneRules, mark_stale, schedule
from specwatch.cost.tuner_compare import compared

MIN_SPREAD = 0.25  # draft tokens per step between a level's two most distant points
MIN_STEPS = 20.0  # decoding steps behind a step-cost point
PER_STEP = (
    "accepted / drafted at each position, from the drafts the producer counted per step (the bundled engine; "
    "vLLM with --per-request-spec-decode-metrics detailed)"
)
SUMMARY = (
    "accepted at each position, every draft taken to reach gamma (no per-step counts: vLLM with "
    "--per-request-spec-decode-metrics summary)"
)
UNDERCOUNT = (
    "requests without drafts_per_position (vLLM at --per-request-spec-decode-metrics summary) take every draft "
    "to reach their gamma: under a varying k (a schedule, drafts cut short near max_tokens) that undercounts "
    "later positions; start vLLM with `detailed` for exact per-position acceptance"
)


@dataclass(frozen=True)
class Profile:
    """A step-cost profile read from JSON (`read_profile`): curves per level, and what the profiler measured."""

    curves: dict[int, StepCurve]
    acceptance: dict[int, Acceptance] = field(default_factory=dict)
    made_at: float | None = None
    version: str | None = None
    measured: dict[int, dict[int, float]] = field(default_factory=dict)  # {level: {k: end-to-end tokens/s}}


def weights(rows: TuningRows) -> tuple[np.ndarray, np.ndarray]:
    """(levels, n x levels fractions) of each request's life, time-weighted per instance."""
    start = rows.started_at + rows.queue_s
    end = np.maximum(rows.started_at + rows.e2e_s, start)
    return level_fractions(Spans(rows.instance, start, end, np.full(len(rows), np.nan)))


def steps(rows: TuningRows) -> np.ndarray:
    return np.maximum(rows.output_tokens - 1 - rows.accepted, 0.0)


def _parts(rows: TuningRows, picked: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per picked request: (accepted per position, drafts reaching each position, drafts, steps)."""
    return rows.per_position[picked], rows.reach[picked], rows.drafts[picked], steps(rows)[picked]


def _acceptance_of(parts, w: np.ndarray, axis_sum) -> tuple[np.ndarray, np.ndarray]:
    """(rates per position, q) from weighted sums; `axis_sum(x)` sums over requests."""
    per_position, reach, drafts, forwards = parts
    rates = axis_sum(per_position * w[..., None]) / np.maximum(axis_sum(reach * w[..., None]), 1e-300)
    q = np.minimum(axis_sum(drafts * w) / np.maximum(axis_sum(forwards * w), 1e-300), 1.0)
    return rates, q


def acceptance(rows: TuningRows, w: np.ndarray) -> Acceptance | None:
    """A level's acceptance from the speculative requests with known counts (w: their weight there)."""
    picked = np.flatnonzero(rows.speculative & rows.counts_known & (w > 0) & (rows.drafts > 0))
    if not len(picked):
        return None
    parts = _parts(rows, picked)
    reached = (parts[1] * w[picked, None]).sum(axis=0) > 0
    top = int(reached.sum()) if reached.all() else int(np.argmin(reached))
    rates, q = _acceptance_of(parts, w[picked], lambda x: x.sum(axis=0))
    drafts = float((rows.drafts[picked] * w[picked]).sum())
    source = reach_source(rows.reach_counted[picked])
    return Acceptance(tuple(float(r) for r in rates[:top]), float(q), float(w[picked].sum()), drafts, source)


def reach_source(counted: np.ndarray) -> str:
    """Where per-position acceptance's denominators came from, for the requests behind it."""
    if counted.all():
        return f"records: {PER_STEP}"
    if not counted.any():
        return f"records: {SUMMARY}"
    return f"records: {PER_STEP} for {int(counted.sum())} of {len(counted)} requests, else {SUMMARY}"


def interval(
    rows: TuningRows, w: np.ndarray, level: int, cost: StepCurve, top: int, resamples: int, draft_rate: float = 1.0
):
    """95% bootstrap bounds of tokens/s for k = 0..top, resampling the level's speculative requests (the step
    cost at each k read at the bucket's own draft rate q, `StepCurve.at_k`)."""
    picked = np.flatnonzero(rows.speculative & rows.counts_known & (w > 0) & (rows.drafts > 0))
    if resamples <= 0 or len(picked) < 2:
        return None
    from scipy.stats import bootstrap

    parts, weight = _parts(rows, picked), w[picked]
    seconds = np.array([cost.at_k(k, draft_rate) for k in range(top + 1)])

    def tokens_per_s(index, axis=-1):
        i = index.astype(int)
        over_requests = lambda x: x.sum(axis=-2 if x.ndim > i.ndim else -1)  # noqa: E731
        rates, q = _acceptance_of(tuple(p[i] for p in parts), weight[i], over_requests)
        cumulative = np.concatenate([np.zeros((*q.shape, 1)), np.cumsum(rates[..., :top], axis=-1)], axis=-1)
        return np.moveaxis(level * (1 + q[..., None] * cumulative) / seconds, -1, 0)

    batch = max(1, int(4e6 // (len(picked) * (parts[0].shape[1] + 3))))  # resamples per vectorized call
    found = bootstrap((np.arange(len(picked), dtype=float),), tokens_per_s, vectorized=True, batch=batch,
                      n_resamples=resamples, method="percentile", random_state=0)  # fmt: skip
    low, high = found.confidence_interval
    return Interval(tuple(map(float, low)), tuple(map(float, high)))


def step_curve(rows: TuningRows, w: np.ndarray, level: int) -> StepCurve | None:
    """A level's step cost from its requests' decode time per step (module docstring)."""
    recorded = rows.verify_s > 0
    decode = np.where(recorded, rows.verify_s + rows.draft_s, rows.e2e_s - np.nan_to_num(rows.ttft_s, nan=np.inf))
    forwards = steps(rows)
    timed = (w > 0) & (forwards > 0) & np.isfinite(decode) & (decode > 0)
    points = []
    for key in sorted({(bool(s), int(g)) for s, g in zip(rows.speculative[timed], rows.gamma[timed])}):
        group = np.flatnonzero(timed & (rows.speculative == key[0]) & (rows.gamma == key[1]))
        n = (forwards[group] * w[group]).sum()
        if n >= MIN_STEPS:
            drafted = np.where(rows.speculative[group], rows.draft_tokens[group], 0.0)
            points.append(((drafted * w[group]).sum() / n, (decode[group] * w[group]).sum() / n))
    if len(points) < 2 or max(p[0] for p in points) - min(p[0] for p in points) < MIN_SPREAD:
        return None
    kinds = {"recorded forward time" if r else "decode wall time (e2e - ttft)" for r in recorded[timed]}
    return StepCurve(level, tuple(sorted(points)), "records: " + " + ".join(sorted(kinds)), per_step=True)


def profile_curves(profile: dict) -> dict[int, StepCurve]:
    """StepCurves from a profile {"levels": {batch: {k: seconds}}, "source": ...}; ValueError when malformed."""
    levels = profile.get("levels") if isinstance(profile, dict) else None
    if not isinstance(levels, dict) or not levels:
        raise ValueError('a profile needs "levels": {"<batch size>": {"<k>": seconds, ...}, ...}')
    source = f"profile: {profile.get('source') or 'given'}"
    curves = {}
    for batch, table in levels.items():
        try:
            points = tuple(sorted((float(k), float(s)) for k, s in table.items()))
            level = int(batch)
        except (TypeError, ValueError, AttributeError):
            raise ValueError(f"profile level {batch!r}: want a batch size and {{k: seconds}}") from None
        if level < 1 or not points or any(k < 0 or s <= 0 for k, s in points):
            raise ValueError(f"profile level {batch!r}: batch >= 1, k >= 0 and seconds > 0")
        curves[level] = StepCurve(level, points, source)
    return curves


def _profile_acceptance(levels, source: str) -> dict[int, Acceptance]:
    """{"<batch>": {"rates": [...], "draft_rate": q, "requests": n, "drafts": d}} as Acceptance per level."""
    if not isinstance(levels, dict):
        raise ValueError('profile "acceptance": want {"<batch size>": {"rates": [...], ...}, ...}')
    found = {}
    for batch, entry in levels.items():
        try:
            rates = tuple(float(a) for a in entry["rates"])
            numbers = [float(entry[key]) for key in ("draft_rate", "requests", "drafts")]
            level = int(batch)
        except (TypeError, ValueError, KeyError, AttributeError):
            raise ValueError(f"profile acceptance {batch!r}: want rates, draft_rate, requests and drafts") from None
        if level < 1 or not all(0 <= a <= 1 for a in (*rates, numbers[0])) or min(numbers[1:]) < 0:
            raise ValueError(f"profile acceptance {batch!r}: batch >= 1, rates and draft_rate in [0, 1]")
        counts = entry.get("from") if isinstance(entry.get("from"), str) else "accepted_per_position"
        found[level] = Acceptance(rates, *numbers, source=f"{source}: {counts[:200]}")
    return found


def read_profile(profile: dict) -> Profile:
    """A profile's curves (`profile_curves`), acceptance per level, date and upstream version; ValueError when
    malformed."""
    curves = profile_curves(profile)
    source = f"profile: {profile.get('source') or 'given'}"
    acceptance = _profile_acceptance(profile.get("acceptance") or {}, source)
    made_at, version = profile.get("made_at"), profile.get("upstream_version")
    if made_at is not None and (type(made_at) not in (int, float) or made_at < 0):
        raise ValueError(f'profile "made_at": want epoch seconds, got {made_at!r}')
    measured = _profile_measured(profile.get("measured") or [])
    return Profile(curves, acceptance, made_at, None if version is None else str(version), measured)


def _profile_measured(rows) -> dict[int, dict[int, float]]:
    """`specwatch tune profile`'s "measured" rows ({"level", "k", "tokens_per_s", ...}) as {level: {k: tokens/s}}
    (the best server per k, should two share one)."""
    if not isinstance(rows, list):
        raise ValueError('profile "measured": want a list of {"level", "k", "tokens_per_s"} rows')
    found: dict[int, dict[int, float]] = {}
    for row in rows:
        try:
            level, k, tps = int(row["level"]), int(row["k"]), row["tokens_per_s"]
        except (TypeError, ValueError, KeyError):
            raise ValueError(f'profile "measured" row {row!r}: want level, k and tokens_per_s') from None
        if tps is not None and type(tps) in (int, float) and tps > 0 and level >= 1 and k >= 0:
            found.setdefault(level, {})[k] = max(float(tps), found.get(level, {}).get(k, 0.0))
    return found


def today_k(rows: TuningRows) -> int:
    """The most common gamma among speculative requests with known counts (0: none)."""
    gammas = rows.gamma[rows.speculative & rows.counts_known & (rows.gamma > 0)]
    return int(np.bincount(gammas).argmax()) if len(gammas) else 0


def recommend(
    rows: TuningRows,
    *,
    rules: TuneRules = TuneRules(),
    current_k: int | None = None,
    profile: Profile | dict[int, StepCurve] | None = None,
    markers: tuple[tuple[str, float, str], ...] = (),
    today: dict[int, int] | None = None,
) -> Schedule:
    """The schedule for these records (module docstring), marked stale against the latest version marker;
    `today`: today's k per level where today's config is a schedule (`cost.tuner_emit.todays_ks`);
    `profile`: a `read_profile` (or its curves alone)."""
    profile = profile if isinstance(profile, Profile) else Profile(dict(profile or {}))
    seen, fractions = weights(rows)
    found_acceptance, costs, intervals = dict(profile.acceptance), dict(profile.curves), {}
    for j, level in enumerate(seen.tolist()):
        w = fractions[:, j]
        found_acceptance[level] = _enough(acceptance(rows, w), found_acceptance.get(level), rules)
        costs[level] = costs.get(level) or step_curve(rows, w, level)
        if found_acceptance[level] and costs[level] and found_acceptance[level] is not profile.acceptance.get(level):
            top = min(rules.max_k, len(found_acceptance[level].rates))
            q = found_acceptance[level].draft_rate
            intervals[level] = interval(rows, w, level, costs[level], top, rules.resamples, q)
    k_now = today_k(rows) if current_k is None else current_k
    plan = schedule(k_now, {lv: a for lv, a in found_acceptance.items() if a}, costs, rules,
                    {lv: i for lv, i in intervals.items() if i}, today, profile.measured)  # fmt: skip
    return _dated(plan, rows, markers, profile)


def _enough(records: Acceptance | None, profiled: Acceptance | None, rules: TuneRules) -> Acceptance | None:
    """The records' acceptance, unless it rests on too little and the profile measured some."""
    little = records is None or records.requests < rules.min_requests or records.drafts < rules.min_drafts
    return profiled if little and profiled is not None else records


def _dated(plan: Schedule, rows: TuningRows, markers, profile: Profile) -> Schedule:
    """The schedule's date (its newest record, else the profile's), drafter, version and staleness."""
    made_at = float((rows.started_at + rows.e2e_s).max()) if len(rows) else profile.made_at
    drafters = rows.drafter[rows.speculative]
    drafter = max(set(drafters.tolist()), key=drafters.tolist().count) if len(drafters) else None
    made_for = next((v for _, at, v in reversed(markers) if made_at is not None and at <= made_at), profile.version)
    current = markers[-1][2] if markers else None
    since = None
    for _, at, version in reversed(markers):  # the start of the latest version's last run
        if version != current:
            break
        since = at
    undercount = bool((rows.speculative & rows.counts_known & (rows.drafts > 0) & ~rows.reach_counted).any())
    notes = (UNDERCOUNT,) if undercount else ()
    plan = replace(plan, made_at=made_at, drafter=drafter, upstream_version=made_for, notes=notes)
    return mark_stale(plan, current, since)


def recommend_from_store(db, window, filters=None, **options) -> Schedule:
    """`recommend` over the store's `window` (collector.reads.tuning_reads), version markers included, with
    notes against static k and on vLLM's adaptive verification (`cost.tuner_compare`); static (`static_only`)
    where the instances' latest markers report more than one data-parallel rank."""
    from specwatch.collector.reads.queries import Filters
    from specwatch.collector.reads.tuning_reads import data_parallel_ranks, tuning_rows, version_markers

    filters = filters or Filters()
    rows = tuning_rows(db, window, filters)
    plan = compared(recommend(rows, markers=version_markers(db, window, filters), **options))
    ranks = data_parallel_ranks(db, window, filters)
    return static_only(plan, ranks) if ranks > 1 else plan


def static_only(plan: Schedule, ranks: int) -> Schedule:
    """vLLM drops `num_speculative_tokens_per_batch_size` at data-parallel size > 1 and runs static k, so a
    schedule would be a no-op: today's k for every batch size, and a note saying why and what it gives up."""
    last = max((end for _, end, _ in plan.ranges), default=1)
    k = plan.today_k
    scheduled = ", ".join(f"[{a}, {b}, {kk}]" for a, b, kk in plan.ranges)
    note = (
        f"data-parallel size {ranks} > 1: vLLM drops num_speculative_tokens_per_batch_size and runs static k, "
        f"so no schedule is emitted; static k = {k} (today's) stays. The schedule it would have been: {scheduled}; "
        "compare another static k with --current-k."
    )
    return replace(plan, ranges=((1, last, k),), static=True, notes=(*plan.notes, note))
