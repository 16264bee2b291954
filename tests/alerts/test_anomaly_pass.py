"""The anomaly pass in the leader's cycle: new requests judged once against their series, flags in
`request_flags`, the cursor persisted across runners."""

from __future__ import annotations

import pytest
from collector_payloads import T0, event_dict, request_dict
from sqlalchemy import select

from specwatch.alerts.anomaly_pass import run_pass
from specwatch.alerts.rules import parse_config
from specwatch.alerts.runner import AlertRunner
from specwatch.alerts.tables import request_flags
from specwatch.collector.ingest.store import Store
from specwatch.telemetry.schema import IngestBatch

CONFIG = parse_config({"rules": [], "receivers": [], "detectors": {"anomalies": {"min_series_requests": 20}}})


def record(i: int, accepted: int, output: int = 64, **overrides) -> dict:
    """16 drafted tokens in 4 drafts of 4; `accepted` of them, front-loaded per position."""
    per_pos = [min(4, max(0, accepted - 4 * k)) for k in range(4)]
    per_pos = sorted(per_pos, reverse=True) if accepted < 16 else [4, 4, 4, 4]
    fields = {"num_accepted_tokens": sum(per_pos), "accepted_per_position": per_pos, "output_tokens": output}
    return request_dict(i, request_id=f"r{i}", tags={}, **{**fields, **overrides})


def ingest(db, records) -> None:
    Store(db).insert(IngestBatch.model_validate({"requests": records, "samples": [], "events": []}))


def flags(db) -> list[tuple[str, str, float]]:
    t = request_flags.c
    with db.connect() as conn:
        rows = conn.execute(select(t.request_id, t.flag, t.flagged_at).order_by(t.request_id, t.flag))
        return [tuple(r) for r in rows]


def test_flags_written_once_and_the_cursor_survives_a_restart(db):
    typical = [record(i, 9 + i % 3) for i in range(40)]  # acceptance 0.5625..0.6875, median 0.625
    ingest(db, typical)
    AlertRunner(db, CONFIG).cycle(T0 + 100)
    assert flags(db) == []
    odd = [record(40, 0), record(41, 16, output=256), record(42, 16, output=32), record(43, 10)]
    ingest(db, odd)
    AlertRunner(db, CONFIG).cycle(T0 + 160)
    expected = [("r40", "collapse", T0 + 160), ("r40", "outlier", T0 + 160), ("r41", "repetition", T0 + 160)]
    assert flags(db) == expected
    runner = AlertRunner(db, CONFIG)  # a new leader: resumes after r43, judges nothing twice
    runner.cycle(T0 + 220)
    assert flags(db) == expected


def test_series_history_judges_a_lone_new_request(db):
    """One new request per pass is still judged against the series' stored history."""
    ingest(db, [record(i, 9 + i % 3) for i in range(30)])
    assert run_pass(db, CONFIG.detectors, T0 + 40).flagged == 0
    ingest(db, [record(30, 1)])
    done = run_pass(db, CONFIG.detectors, T0 + 50)
    assert (done.read, done.judged, done.flagged) == (1, 1, 1)
    assert [f[:2] for f in flags(db)] == [("r30", "outlier")]  # 1/16: low, but not ~0


@pytest.mark.parametrize(("other", "flagged"), [({"instance": "gpu-1"}, 0), ({"drafter": "suffix"}, 0), ({}, 1)])
def test_history_is_per_series(db, other, flagged):
    ingest(db, [record(i, 9 + i % 3) for i in range(30)])
    run_pass(db, CONFIG.detectors, T0 + 40)
    ingest(db, [record(30, 1, **other)])  # another series has no history: too small to judge
    assert run_pass(db, CONFIG.detectors, T0 + 50).flagged == flagged


def marker(at: float, drafter: str) -> dict:
    return event_dict(0, at=at, kind="config", detail={"drafter": drafter})


def served(first: int, n: int, drafters: tuple[str, ...], acceptance: dict[str, int]) -> list[dict]:
    """`n` requests from index `first`, drafters in turn, `acceptance[drafter]` of 16 tokens accepted."""
    picked = [drafters[i % len(drafters)] for i in range(n)]
    return [record(first + i, acceptance[d], drafter=d) for i, d in enumerate(picked)]


ACCEPTED = {"ngram": 15, "suffix": 13, "early-exit:4": 0}
MARKER_CONFIG = parse_config(
    {"rules": [], "receivers": [], "detectors": {"anomalies": {"min_series_requests": 20, "baseline_min_requests": 20}}}
)


@pytest.mark.parametrize(
    ("before", "after", "flagged"),
    [
        (("ngram",), ("early-exit:4",), 20),  # the switch: every new-drafter request at ~0
        (("ngram",), ("ngram", "early-exit:4"), 10),  # the early exit added beside the n-gram drafter
        (("ngram", "early-exit:4"), ("ngram", "early-exit:4"), 0),  # side by side before and after: nothing
        (("ngram",), ("suffix",), 0),  # another drafter that works
    ],
)
def test_collapse_of_a_drafter_new_since_the_marker(db, before, after, flagged):
    Store(db).insert(
        IngestBatch.model_validate(
            {"requests": served(0, 40, before, ACCEPTED), "samples": [], "events": [marker(T0 + 40, after[-1])]}
        )
    )
    run_pass(db, MARKER_CONFIG.detectors, T0 + 41)
    ingest(db, served(40, 20, after, ACCEPTED))
    assert run_pass(db, MARKER_CONFIG.detectors, T0 + 70).flagged == flagged
    assert {f[1] for f in flags(db)} <= {"collapse"} and len(flags(db)) == flagged
