"""The alerts' own tables (SQLAlchemy Core): alert state, history, rule health, the notification outbox
and remediation actions.

The collector's Alembic migrations create them (migration 0004; the change detectors' in 0012), with
the rest of the schema, so one `alembic upgrade` sets up a store; `tests/alerts/test_alert_tables.py`
reflects a migrated database and checks that it matches these definitions. Nothing outside alerts/
(and report/, for the report's link in the outbox) reads or writes them: others call `alerts.store`.
"""

from __future__ import annotations

from sqlalchemy import JSON, BigInteger, Boolean, Column, Double, Index, Integer, MetaData, String, Table

# the collector's naming convention, so the names match what its migrations created
metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "pk": "pk_%(table_name)s",
    }
)
BigId = BigInteger().with_variant(Integer(), "sqlite")  # SQLite aliases rowid only for INTEGER PRIMARY KEY


def _id() -> Column:
    return Column("id", BigId, primary_key=True, autoincrement=True)


def _text(name: str, length: int, nullable: bool = False) -> Column:
    return Column(name, String(length), nullable=nullable)


def _number(name: str, nullable: bool = False) -> Column:
    return Column(name, Double(), nullable=nullable)


def _json(name: str) -> Column:
    return Column(name, JSON(), nullable=False)


# the current state of one alert (pending, firing, or resolved and not yet forgotten)
alert_states = Table(
    "alert_states",
    metadata,
    Column("fingerprint", String(16), primary_key=True),
    _text("rule", 128),
    _json("labels"),
    _json("annotations"),
    _text("state", 16),
    _number("value"),
    _number("active_at"),
    _number("last_seen_at"),
    _number("fired_at", nullable=True),
    _number("resolved_at", nullable=True),
    _number("last_sent_at", nullable=True),
)

# every state change of every alert (the history)
alert_transitions = Table(
    "alert_transitions",
    metadata,
    _id(),
    _number("at"),
    _text("rule", 128),
    _text("fingerprint", 16),
    _json("labels"),
    _text("from_state", 16),
    _text("to_state", 16),
    _number("value"),
    Index("ix_alert_transitions_at", "at"),
)

# the last evaluation of each rule: when, how long, and its error if the signal failed
alert_rule_health = Table(
    "alert_rule_health",
    metadata,
    Column("rule", String(128), primary_key=True),
    _number("evaluated_at"),
    _number("duration_s"),
    _text("error", 1024, nullable=True),
)

# the webhook outbox: one row per notification to one receiver, delivered with retries. `key` is the
# idempotency key (sent as `Idempotency-Key`); `status` is pending, delivered or dead.
alert_notifications = Table(
    "alert_notifications",
    metadata,
    _id(),
    Column("key", String(64), nullable=False, unique=True),
    _text("receiver", 64),
    _text("rule", 128),
    _text("alert_status", 16),
    _json("payload"),
    _number("created_at"),
    _text("status", 16),
    Column("attempts", Integer(), nullable=False),
    _number("next_attempt_at"),
    _text("last_error", 1024, nullable=True),
    _number("delivered_at", nullable=True),
    Index("ix_alert_notifications_status_next_attempt_at", "status", "next_attempt_at"),
)

# a remediation an alert triggered (or recommended), with its outcome
alert_actions = Table(
    "alert_actions",
    metadata,
    _id(),
    _number("at"),
    _text("rule", 128),
    _text("fingerprint", 16),
    _text("action", 64),
    _text("instance", 128, nullable=True),
    _text("outcome", 16),
    _json("detail"),
    Index("ix_alert_actions_at", "at"),
)

# the change detectors' series (migration 0012): one row per (kind, series), `kind` drift (alerts.baselines:
# the CUSUM's state and score) or regression (alerts.regression: before/after a deploy marker). `value` is
# what the kind's alert signal reads; `state` the detector's own state, so a restarted leader resumes.
alert_detector_series = Table(
    "alert_detector_series",
    metadata,
    Column("series", String(64), primary_key=True),
    _text("kind", 16),
    _json("labels"),
    _number("value"),
    Column("count", BigInteger(), nullable=False),
    Column("significant", Boolean(), nullable=False),
    _json("annotations"),
    _json("state"),
    _number("updated_at"),
    Index("ix_alert_detector_series_kind_updated_at", "kind", "updated_at"),
)

# where each detector's pass over the requests continues (the last request id it read)
alert_detector_cursors = Table(
    "alert_detector_cursors",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("position", BigInteger(), nullable=False),
)

# per-request anomalies the leader's pass flagged (alerts.anomalies): `flag` is outlier, repetition or
# collapse; `value` the request's acceptance, `expected` its series' median; the Requests page filters on them
request_flags = Table(
    "request_flags",
    metadata,
    Column("request_id", String(128), primary_key=True),
    Column("flag", String(16), primary_key=True),
    _number("started_at"),
    _text("instance", 128),
    _text("model", 128),
    _text("drafter", 256, nullable=True),
    _number("value"),
    _number("expected"),
    _json("detail"),
    _number("flagged_at"),
    Index("ix_request_flags_started_at", "started_at"),
    Index("ix_request_flags_flag_started_at", "flag", "started_at"),
)
