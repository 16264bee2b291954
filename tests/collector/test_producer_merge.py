"""Issue 52 item 5 and issue 57 #7: a request reported by the engine that ran it and by the gateway in front
of it is one row, the same whichever record arrives first: the engine's timings, tokens, mode, drafter and
acceptance, the gateway's routing (arm, reason, tags); the per-second aggregates follow the merged row.
SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from collector_payloads import T0, request_dict
from sqlalchemy import select

from specwatch.collector.ingest.merge import COLUMNS
from specwatch.collector.ingest.store import Store
from specwatch.collector.models import Request
from specwatch.collector.reads import window_signals
from specwatch.collector.reads.queries import Filters, Window, signals
from specwatch.telemetry.schema import IngestBatch

START = T0 + 20.25


def engine_record(request_id: str = "shared-1", **overrides) -> dict:
    """What the engine recorded: it ran plainly (n-gram found nothing to draft), on its own device time."""
    fields = dict(
        request_id=request_id, instance="laptop", started_at=START, mode="autoregressive", drafter=None,
        num_drafts=0, num_draft_tokens=0, num_accepted_tokens=0, accepted_per_position=[], gamma=0,
        ttft_s=0.31, e2e_s=1.80, output_tokens=96, prompt_tokens=200, queue_s=0.02,
        device_s=1.5, device_s_source="engine", tags={"tenant": "acme"},
    )  # fmt: skip
    return request_dict(0, **{**fields, **overrides})


def gateway_record(request_id: str = "shared-1", **overrides) -> dict:
    """What the gateway recorded: its upstream's declared drafter, its own clock, its routing."""
    fields = dict(
        request_id=request_id, instance="laptop", started_at=START, mode="speculative", drafter="ngram",
        mode_reason="canary", arm="spec", num_drafts=0, num_draft_tokens=0, num_accepted_tokens=0,
        accepted_per_position=[], gamma=0, draft_counts_known=False, ttft_s=0.35, e2e_s=1.86,
        output_tokens=96, prompt_tokens=200, device_s=1.7, device_s_source="processor_sharing",
        tags={"tenant": "acme", "gateway": "edge", "upstream": "e"},
    )  # fmt: skip
    return request_dict(0, **{**fields, **overrides})


def stored_rows(db) -> list[dict]:
    with db.connect() as conn:
        return [dict(zip(COLUMNS, row)) for row in conn.execute(select(*(getattr(Request, c) for c in COLUMNS)))]


def store(db, *records: dict, together: bool = False) -> Store:
    writer = Store(db)
    batches = [list(records)] if together else [[record] for record in records]
    for batch in batches:
        writer.insert(IngestBatch.model_validate({"requests": batch}))
    return writer


@pytest.mark.parametrize("order", ["engine first", "gateway first", "one batch"])
def test_one_row_whichever_producer_arrives_first(db, order):
    engine, gateway = engine_record(), gateway_record()
    records = (engine, gateway) if order != "gateway first" else (gateway, engine)
    store(db, *records, together=order == "one batch")
    (row,) = stored_rows(db)
    for field in ("mode", "drafter", "queue_s", "output_tokens", "device_s", "device_s_source"):
        assert row[field] == engine[field], field  # what ran, from the producer that ran it
    for field in ("ttft_s", "e2e_s"):
        assert row[field] == gateway[field], field  # what the client saw: it talked to the gateway
    assert row["draft_counts_known"] is True or row["draft_counts_known"] == 1
    assert (row["arm"], row["mode_reason"]) == ("spec", "canary")  # the gateway's routing
    assert row["tags"] == {"tenant": "acme", "gateway": "edge", "upstream": "e"}
    assert (row["status"], row["instance"], row["started_at"]) == ("ok", "laptop", START)


def test_the_aggregates_follow_the_merged_row(db):
    """The gateway's record (speculative, arm spec) was aggregated first; after the engine's arrives the
    window's signals, from aggregates as from raw rows, count one plain request."""
    store(db, gateway_record(), gateway_record("alone"), engine_record())
    window = Window(T0, T0 + 60)
    for read in (signals, window_signals.signals):
        assert read(db, window, Filters(mode="speculative")).requests == 1, read  # 'alone' has no engine record
        plain = read(db, window, Filters(mode="autoregressive", arm="spec"))
        assert (plain.requests, plain.output_tokens) == (1, 96), read
        assert read(db, window).requests == 2, read
    exact = window_signals.signals(db, window, Filters(mode="autoregressive")).ttft
    assert exact.count == 1 and exact.p50 == pytest.approx(0.35, rel=0.01)  # the gateway's, its client's


def test_a_gateway_without_its_own_ttft_keeps_the_engines(db):
    """A whole (non-streamed) answer gives the gateway no first chunk to time: the engine's TTFT stays."""
    store(db, gateway_record(ttft_s=None), engine_record())
    (row,) = stored_rows(db)
    assert (row["ttft_s"], row["e2e_s"]) == (0.31, 1.86)


def test_a_failure_only_the_gateway_saw_is_kept_and_engine_errors_keep_their_detail(db):
    store(db, engine_record("cut"), gateway_record("cut", status="cancelled", error="client:disconnected"))
    store(db, gateway_record("refused", status="error", error="upstream:400", output_tokens=0))
    store(db, engine_record("refused", status="error", error="refused:unsupported", output_tokens=0))
    rows = {row["request_id"]: row for row in stored_rows(db)}
    assert (rows["cut"]["status"], rows["cut"]["error"]) == ("cancelled", "client:disconnected")
    assert (rows["refused"]["status"], rows["refused"]["error"]) == ("error", "refused:unsupported")


def test_records_of_one_producer_or_of_other_instances_are_never_merged(db):
    writer = store(db, engine_record())
    counts = writer.insert(IngestBatch.model_validate({"requests": [engine_record(ttft_s=0.9)]}))
    assert counts.conflicts == 1  # the same producer said two things: a conflict, not a merge
    store(db, gateway_record(instance="other-host"))  # another instance's: not this request's peer
    (row,) = stored_rows(db)
    assert (row["ttft_s"], row["arm"]) == (0.31, None)
