"""Device time per request: how one batched target forward's measured seconds are shared out.

The rule (`split_by_step_curve`), for a forward of b requests that fed R token rows in all and took T s:

    base     = curve(b, 1 row each)                   # what the forward costs with one row per request
    marginal = max(curve(b, R / b) - base, 0)         # what the rows beyond one per request add
    share_i  = T * (base / b + marginal * (n_i - 1) / (R - b)) / (base + marginal)

Every request pays an equal share of the one-row-per-request forward; the draft rows pay the marginal
cost they add, each request for the extra rows it fed. The shares add up to T, so the requests' device
time adds up to the scheduler's busy time. The curve is the engine's measured step-cost curve
(`engine.lookahead.CostCurve`: seconds per forward against rows per request, per batch size), the one
the cost-aware lookahead reads. Until it has measured two row counts at a batch size, a forward with
draft rows is split by token rows instead (`split_by_rows`), as is a forward that also fed a new request's
prompt chunk (the curve prices verifications, not prompts), and the record says so:

    device_s_source = 'engine_step_curve'  every shared forward of the request split by the curve
                      'engine'             row shares in at least one of them, or no shared forward
"""

from __future__ import annotations

from collections.abc import Sequence

from specwatch.engine.lookahead import CostCurve

STEP_CURVE, ROW_SHARES = "engine_step_curve", "engine"  # telemetry.schema DeviceSource values


def split_by_rows(seconds: float, rows: Sequence[int]) -> list[float]:
    """Each request's share of one batched forward that took `seconds`, in proportion to the token
    rows it fed: the shares add up to `seconds`, so the requests' device time adds up to busy time."""
    total = sum(rows)
    if total <= 0 or min(rows) < 0:
        raise ValueError(f"a forward's token rows must be >= 0 and not all 0, got {list(rows)}")
    return [seconds * n / total for n in rows]


def split_by_step_curve(seconds: float, rows: Sequence[int], curve: CostCurve) -> list[float] | None:
    """The module's rule; None when the curve has not measured what rows cost at this batch size
    (a forward of one row per request needs no measurement: equal shares)."""
    if not rows or min(rows) < 1:
        raise ValueError(f"every request in a forward feeds >= 1 token row, got {list(rows)}")
    b, total = len(rows), sum(rows)
    extra = total - b
    if extra == 0:
        return [seconds / b] * b
    if not curve.measured(b):
        return None
    base = curve.cost(b, 1.0)
    marginal = max(curve.cost(b, total / b) - base, 0.0)  # rows per request as the scheduler observes them
    return [seconds * (base / b + marginal * (n - 1) / extra) / (base + marginal) for n in rows]


def split_forward(
    seconds: float, rows: Sequence[int], curve: CostCurve, prompt: bool = False
) -> tuple[list[float], str]:
    """(shares, rule): by the step-cost curve where it has measurements, else by token rows; by token
    rows too where a prompt chunk was among the rows (`prompt`: the curve prices verifications only)."""
    shares = None if prompt else split_by_step_curve(seconds, rows, curve)
    return (shares, STEP_CURVE) if shares is not None else (split_by_rows(seconds, rows), ROW_SHARES)


def record_source(rules: set[str]) -> str:
    """A request's device_s_source from the rules that split the shared forwards it was in."""
    return STEP_CURVE if rules == {STEP_CURVE} else ROW_SHARES
