"""Property: whatever arrives at /v1/ingest, the answer is never a 5xx, and a refused batch stores nothing."""

from __future__ import annotations

import json

from collector_payloads import event_dict, request_dict, sample_dict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from specwatch.collector.models import DeviceSampleRow, EngineEventRow, Request

TEXT = st.text(max_size=40) | st.text(alphabet="a-:\x00\u2028é\U0001f600", max_size=8)
JSON_SCALARS = st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats() | TEXT
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
FACTORIES = {"requests": request_dict, "samples": sample_dict, "events": event_dict}


@st.composite
def mutated_batches(draw) -> dict:
    """A valid batch with one field of one record replaced (or removed, or a key added)."""
    kind = draw(st.sampled_from(sorted(FACTORIES)))
    records = [FACTORIES[kind](i) for i in range(draw(st.integers(1, 3)))]
    target = records[draw(st.integers(0, len(records) - 1))]
    field = draw(st.sampled_from(sorted(target)) | st.text(min_size=1, max_size=8))
    if draw(st.booleans()) and field in target:
        del target[field]
    else:
        target[field] = draw(JSON_VALUES)
    return {kind: records}


BODIES = (
    st.builds(lambda v: json.dumps(v).encode(), JSON_VALUES | mutated_batches())
    | st.binary(max_size=64)
    | st.builds(lambda v: json.dumps({"requests": [v]}).encode(), JSON_VALUES)
)


def count(client) -> int:
    with client.app.state.store.db.connect() as conn:
        return sum(conn.scalar(select(func.count()).select_from(t)) for t in (Request, DeviceSampleRow, EngineEventRow))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=BODIES)
def test_random_payloads_never_give_5xx(client, body):
    before = count(client)
    response = client.post("/v1/ingest", content=body, headers={"content-type": "application/json"})
    assert response.status_code < 500, (response.status_code, response.text)
    if response.status_code != 200:
        assert count(client) == before
