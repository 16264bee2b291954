"""GET /v1/requests and /v1/requests/{id}: filters, every sort in both orders paged by keyset cursor
(pages joined equal the whole sorted listing), flags from request_flags, one request's detail."""

from __future__ import annotations

import pytest
from collector_payloads import T0, plain_request_dict, request_dict
from sqlalchemy import insert

from specwatch.alerts.tables import request_flags
from specwatch.collector.ingest.store import Store
from specwatch.collector.reads import request_reads
from specwatch.collector.reads.queries import Filters
from specwatch.telemetry.schema import IngestBatch

WINDOW = {"start": T0 - 10, "end": T0 + 3600}
N = 23


def records() -> list[dict]:
    """N requests with distinct TTFT, e2e and acceptance (ties on e2e so the id breaks them), one plain,
    two errors, two instances."""
    found = []
    for i in range(N):
        per_pos = [4, 3, 2, 1] if i % 3 == 0 else [4, i % 4, 0, 0]
        fields = dict(request_id=f"q{i:02d}", ttft_s=0.01 * ((i * 7) % N), e2e_s=1.0 + (i % 5) / 10)
        fields |= dict(accepted_per_position=per_pos, num_accepted_tokens=sum(per_pos), tags={"tenant": f"t{i % 2}"})
        fields |= dict(instance="gpu-1" if i % 4 == 0 else "gpu-0", status="error" if i in (5, 6) else "ok")
        found.append(request_dict(i, **fields))
    return [*found, plain_request_dict(N, request_id="plain", ttft_s=None)]


@pytest.fixture
def stored(client):
    db = client.app.state.store.db
    Store(db).insert(IngestBatch.model_validate({"requests": records(), "samples": [], "events": []}))
    flag = {"started_at": T0, "instance": "gpu-0", "model": "m", "drafter": "ngram", "flagged_at": T0}
    rows = [("q03", "outlier"), ("q03", "collapse"), ("q07", "repetition")]
    with db.begin() as conn:
        conn.execute(
            insert(request_flags),
            [flag | {"request_id": r, "flag": f, "value": 0.0, "expected": 0.6, "detail": {}} for r, f in rows],
        )
    return client


def pages(client, **params) -> list[list[dict]]:
    found, cursor = [], None
    while True:
        body = client.get(
            "/v1/requests", params={**WINDOW, "limit": 5, **params, **({"cursor": cursor} if cursor else {})}
        )
        assert body.status_code == 200, body.text
        found.append(body.json()["rows"])
        if (cursor := body.json()["next_cursor"]) is None:
            return found


def expected_order(key, descending: bool) -> list[str]:
    rows = [r for r in records() if key(r) is not None]
    ordered = sorted(rows, key=lambda r: (key(r), int(r["started_at"])), reverse=descending)
    return [r["request_id"] for r in ordered]


def acceptance(r):
    return r["num_accepted_tokens"] / r["num_draft_tokens"] if r["num_draft_tokens"] else None


SORTS = {
    "time": lambda r: r["started_at"],
    "ttft": lambda r: r["ttft_s"],
    "e2e": lambda r: r["e2e_s"],
    "acceptance": acceptance,
}


@pytest.mark.parametrize("whole_window_rows", [30_000, 0])  # read by time and sorted | walk the sort's index
@pytest.mark.parametrize("order", ["desc", "asc"])
@pytest.mark.parametrize("sort", list(SORTS))
def test_every_sort_pages_by_keyset(stored, sort, order, whole_window_rows, monkeypatch):
    monkeypatch.setattr(request_reads, "WHOLE_WINDOW_ROWS", whole_window_rows)
    found = pages(stored, sort=sort, order=order)
    with stored.app.state.store.db.connect() as conn:
        q = request_reads.RequestQuery(sort, order == "desc", limit=5)
        walks = request_reads.walk_sort_index(conn, request_reads.Window(WINDOW["start"], WINDOW["end"]), Filters(), q)
    assert walks == (sort == "time" or whole_window_rows == 0)
    assert all(len(p) == 5 for p in found[:-1]) and 0 < len(found[-1]) <= 5
    assert [r["request_id"] for p in found for r in p] == expected_order(SORTS[sort], order == "desc")


@pytest.mark.parametrize(
    ("params", "ids"),
    [
        ({"instance": "gpu-1"}, {f"q{i:02d}" for i in range(0, N, 4)}),
        ({"status": "error"}, {"q05", "q06"}),
        ({"drafter": "none"}, {"plain"}),
        ({"tag": "tenant:t1"}, {f"q{i:02d}" for i in range(1, N, 2)}),
        ({"flag": "collapse"}, {"q03"}),
        ({"flag": "any"}, {"q03", "q07"}),
        ({"flag": "any", "instance": "gpu-1"}, set()),
    ],
)
def test_filters(stored, params, ids):
    assert {r["request_id"] for p in pages(stored, **params) for r in p} == ids


def test_rows_carry_their_flags_and_acceptance(stored):
    rows = {r["request_id"]: r for p in pages(stored) for r in p}
    assert rows["q03"]["flags"] == ["collapse", "outlier"] and rows["q04"]["flags"] == []
    assert rows["q03"]["acceptance"] == pytest.approx(10 / 16) and rows["plain"]["acceptance"] is None


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"sort": "tokens"}, None),
        ({"limit": 0}, None),
        ({"cursor": "not-a-cursor"}, "invalid_cursor"),
        ({"flag": "weird"}, None),
    ],
)
def test_bad_input_is_422(stored, params, error):
    response = stored.get("/v1/requests", params={**WINDOW, **params})
    assert response.status_code == 422
    if error:
        assert response.json()["detail"]["error"] == error


def test_a_cursor_of_another_sort_is_refused(stored):
    cursor = stored.get("/v1/requests", params={**WINDOW, "limit": 2, "sort": "ttft"}).json()["next_cursor"]
    response = stored.get("/v1/requests", params={**WINDOW, "sort": "e2e", "cursor": cursor})
    assert response.status_code == 422 and "ttft" not in response.json()["detail"]["message"]


def test_one_request_in_detail(stored):
    body = stored.get("/v1/requests/q03").json()
    assert body["record"]["request_id"] == "q03" and body["record"]["tags"] == {"tenant": "t1"}
    assert body["position_acceptance"] == [1.0, 0.75, 0.5, 0.25]  # per-position counts over 4 drafts
    assert body["acceptance"] == pytest.approx(10 / 16) and body["mean_acceptance_length"] == pytest.approx(3.5)
    assert body["tpot_s"] == pytest.approx((1.3 - 0.21) / 63)
    assert sorted(f["flag"] for f in body["flags"]) == ["collapse", "outlier"]
    assert stored.get("/v1/requests/nope").status_code == 404
