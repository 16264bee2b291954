"""Retries measured (issue 52 #6): the engine reports the failed attempt's device seconds, and speculation's
retries line books them, not an even split; a producer that cannot tell keeps the assumed k/(k+1), and the
assumptions table says how many requests rest on each.

The audit's case: a speculative request that failed after 0.6 s of device time and was retried plainly for
3.4 s. An even split books 2 s of its 4 s to retries; the measurement says 0.6 s.
"""

from __future__ import annotations

import pytest
from collector_payloads import T0, plain_request_dict, request_dict
from pydantic import ValidationError

from specwatch.collector.ingest.store import Store
from specwatch.collector.reads.queries import Window
from specwatch.cost.allocation import allocate
from specwatch.cost.assumptions import assumptions
from specwatch.cost.inputs import load_prices
from specwatch.cost.measured import measured_inputs
from specwatch.telemetry.schema import IngestBatch

TIMED = {"device_s_source": "engine", "e2e_s": 5.0}


def _retries_s(db) -> tuple:
    inputs = measured_inputs(db, Window(T0, T0 + 600), load_prices(), gpu_type="H100-SXM", measure_storage=False)
    lines = allocate(inputs).lines
    usd_per_s = next(bill.usd_per_s for bill in allocate(inputs).bills)
    return sum(line.usd for line in lines if line.kind == "retries") / usd_per_s, inputs


def _store(db, **retried) -> None:
    requests = [
        request_dict(1, device_s=4.0, retries=1, error="draft:oom", **TIMED, **retried),
        request_dict(2, device_s=4.0, **TIMED),
        plain_request_dict(3, device_s=4.0, **TIMED),
    ]
    Store(db).insert(IngestBatch.validate_wire({"requests": requests}))


def test_the_failed_attempts_measured_seconds_are_the_retries_line(db):
    _store(db, failed_device_s=0.6)
    seconds, inputs = _retries_s(db)
    assert seconds == pytest.approx(0.6)
    (row,) = [a for a in assumptions(inputs) if a.name.startswith("retried requests")]
    assert (row.value, row.source) == (1, "measured")


def test_without_a_measurement_the_split_is_assumed_and_marked(db):
    _store(db)
    seconds, inputs = _retries_s(db)
    assert seconds == pytest.approx(2.0)  # k/(k+1) of 4 s
    (row,) = [a for a in assumptions(inputs) if a.name.startswith("retried requests")]
    assert (row.value, row.source) == (1, "estimate") and "k/(k+1)" in row.name


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"failed_device_s": 0.6}, "needs retries >= 1"),
        ({"failed_device_s": 5.0, "retries": 1}, "must be <= device_s"),
    ],
)
def test_a_failed_time_that_cannot_be_is_refused(fields, message):
    with pytest.raises(ValidationError, match=message):
        IngestBatch.validate_wire({"requests": [request_dict(1, device_s=4.0, **TIMED, **fields)]})
