"""The break-even's step times and where they came from: `step_inputs(inputs, arm)` (cost.breakeven's
docstring says the rule: the engine's step-cost curve at one batch size, else the records' timings)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from specwatch.collector.reads.curve_reads import StoredCurve
from specwatch.cost.model import CostInputs, ModeMeasure
from specwatch.cost.step_curve import CurveTimes, curve_times, lacking

STEP_CURVE, RECORDS, NOT_MEASURED = "step_curve", "records", "not measured"  # where t_plain and t_verify came from


@dataclass(frozen=True)
class StepInputs:
    """The break-even's times (seconds) and where they came from: `times_from` is `step_curve` (the engine's
    curve, `curve` says where on it), `records` (the records' timings) or `not measured` (no plain arm)."""

    t_plain: float | None  # per plain step: one forward of `batch` requests
    t_verify: float | None  # per verify forward of `batch` requests
    t_draft: float | None  # per drafted token, of one request (the engine drafts request by request)
    level: int | None  # the concurrency level they were measured at (None: the window's totals or the curve)
    source: str
    warnings: tuple[str, ...]
    times_from: str = RECORDS
    curve: CurveTimes | None = None
    batch: int = 1  # requests sharing the forwards t_plain and t_verify were timed at

    @property
    def v(self) -> float | None:
        """t_verify / t_plain: both forwards of `batch` requests, so the ratio holds per request too."""
        return self.t_verify / self.t_plain if self.t_plain and self.t_verify else None

    @property
    def c(self) -> float | None:
        """One request's draft seconds per drafted token / its share of the verify forward (t_verify / batch):
        per request, so at batch 16 a serial draft weighs 16x what it does against the whole forward."""
        if self.t_draft is None or not self.t_verify:
            return None
        return self.t_draft * self.batch / self.t_verify


def step_inputs(inputs: CostInputs, spec: ModeMeasure) -> StepInputs:
    """t_plain and t_verify from the engine's step-cost curve at one batch size, else from the records
    (one concurrency level, else the totals); t_draft from the records; with warnings (module docstring)."""
    gamma, curves = spec.mean_draft_length, _arm_curves(inputs, spec.key)
    found = curve_times(curves, gamma) if gamma else None
    if found is not None:
        where = f"step-cost curve of {found.instance} at batch {found.batch}"
        steps = StepInputs(
            found.t_plain, found.t_verify, _per_draft(spec), None, where, (), STEP_CURVE, found, found.batch
        )
        return _v_warnings(steps)
    records = _record_inputs(inputs, spec)
    return replace(records, warnings=(*_no_curve(curves, gamma, spec), *records.warnings))


def _arm_curves(inputs: CostInputs, key: str) -> list[StoredCurve]:
    """The curves of the instances that served arm `key` (every curve when the instances are not known)."""
    served = {i.name for i in inputs.instances if any(use.arm == key for use in i.arms)}
    return [c for c in inputs.step_curves if not inputs.instances or c.instance in served]


def _no_curve(curves: list[StoredCurve], gamma: float | None, spec: ModeMeasure) -> tuple[str, ...]:
    """Why the records' timings stand in: the curve lacks the rows, or an engine's arm has none stored."""
    if not gamma:
        return ()
    if curves:
        return (f"{lacking(curves, gamma)}: times from the records",)
    if "engine" in spec.device_s_source:
        return ("no step-cost curve stored for this arm's engines in the window: times from the records",)
    return ()


def _record_inputs(inputs: CostInputs, spec: ModeMeasure) -> StepInputs:
    """The records' timings at one concurrency level where both arms were timed, else the window's totals."""
    plain = inputs.baseline
    if plain is None:
        no_plain = ("no plain arm: v not measured",)
        return StepInputs(None, None, _per_draft(spec), None, NOT_MEASURED, no_plain, NOT_MEASURED)
    level, found = _common_level(inputs, spec.key, plain.key)
    if level is not None:
        return _v_warnings(StepInputs(*found, level, f"measured at concurrency level {level}", (), batch=level))
    times = (
        per_forward(plain.verify_s, plain.target_forwards),
        per_forward(spec.verify_s, spec.target_forwards),
        _per_draft(spec),
    )
    warnings = (
        (
            "no concurrency level with both arms timed: v and c from the window's totals (taken at batch 1), "
            "confounded by batch size",
        )
        if inputs.step_times
        else ()
    )
    return _v_warnings(StepInputs(*times, None, "the window's totals", warnings))


def _v_warnings(steps: StepInputs) -> StepInputs:
    """Flag a v that is not measured, or below 1."""
    if steps.v is None:
        warning = "verify or plain step times not measured: v not measured"
    elif steps.v < 1:
        warning = f"v = {steps.v:.2f} < 1: a verify forward timed cheaper than a plain step (confounded or noise)"
    else:
        return steps
    return replace(steps, warnings=(*steps.warnings, warning))


def per_forward(seconds: float, forwards: int) -> float | None:
    return seconds / forwards if forwards > 0 and seconds > 0 else None


def _per_draft(arm) -> float | None:
    return arm.draft_s / arm.draft_tokens if arm.draft_tokens > 0 and arm.verify_s > 0 else None


def _common_level(inputs: CostInputs, spec: str, plain: str):
    """(level, (t_plain, t_verify, t_draft)) where both arms were timed, the one with most speculative forwards."""
    at = {(s.level, s.arm): s for s in inputs.step_times}
    both = [(at[(lv, spec)], at[(lv, plain)]) for lv, arm in at if arm == spec and (lv, plain) in at]
    both = [(s, p) for s, p in both if s.seconds_per_forward and p.seconds_per_forward]
    if not both:
        return None, None
    s, p = max(both, key=lambda pair: pair[0].target_forwards)
    draft = s.draft_s / s.draft_tokens if s.draft_tokens > 0 else None
    return s.level, (p.seconds_per_forward, s.seconds_per_forward, draft)
