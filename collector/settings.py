"""Collector configuration: one `Settings` object, read once from `SPECWATCH_*` env vars.

Build it once at start-up (`Settings()`), pass it down; nothing else reads the environment.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from specwatch.common.auth import ROLE_ENV, TokenTable


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPECWATCH_", frozen=True, extra="ignore")

    data_dir: Path = Path("data")
    # Empty means SQLite at <data_dir>/specwatch.db (see `database_url_resolved`).
    database_url: str = ""
    # Bearer tokens per role, comma-separated (rotation: several at once), and a file of
    # `ROLE TOKEN [tenant=NAME [instances=A,B]]` lines (a tenant's ingest token names the instances it may
    # write: docs/security.md); none configured: every endpoint is open (the laptop default).
    ingest_token: str | None = None
    read_token: str | None = None
    admin_token: str | None = None
    tokens_file: Path | None = None
    # /metrics without a token even when tokens are configured (a Prometheus on a trusted network).
    metrics_public: bool = False
    max_body_bytes: int = Field(default=32 * 1024 * 1024, gt=0)  # also the most a gzip body may inflate to
    # An ingest body must arrive whole within this many seconds (else 408 and the connection is closed).
    body_timeout_s: float = Field(default=10.0, gt=0)
    # Worker processes that parse, validate and store ingest batches (0: threads of the service).
    ingest_processes: int = Field(default=2, ge=0, le=32)
    # Raw rows older than this are deleted; per-minute rollups are kept `rollup_retention_days`.
    retention_days: float = Field(default=14.0, gt=0)
    rollup_retention_days: float = Field(default=400.0, gt=0)
    maintenance_interval_s: float = Field(default=60.0, gt=0)
    # Replicas on one PostgreSQL: this one's name in /readyz and logs (empty: host:pid), and how often a
    # follower tries to become the leader / the leader checks its lock (see collector.leader).
    replica_id: str = ""
    leader_retry_s: float = Field(default=5.0, gt=0)
    # SPECWATCH_SCRAPE_VLLM: a JSON list or comma-separated URLs of /metrics endpoints (vLLM, SGLang, llama.cpp,
    # TensorRT-LLM: collector.ingest.exposition finds the engine by its metric prefix)
    scrape_vllm: Annotated[list[str], NoDecode] = Field(default_factory=list)
    scrape_interval_s: float = Field(default=15.0, gt=0)
    # Speculation inactive (collector.reads.speculation): an instance configured to speculate that drafted on
    # fewer than this share of its decode steps over the last `speculation_window_s` seconds (/metrics, API).
    speculation_min_fraction: float = Field(default=0.05, ge=0, le=1)
    speculation_window_s: float = Field(default=120.0, gt=0)
    # The alert runner evaluates the rules file (default: the shipped alerts/default_rules.yaml).
    alerts_enabled: bool = True
    alert_rules: Path | None = None
    # Where people reach this collector (links in webhook payloads).
    external_url: str = ""
    # Set: last month's report is written here once a month and its link sent to the webhooks.
    report_dir: Path | None = None
    # Hidden-cost overrides for that report (TOML, the keys of [hidden] in cost/cost_example.toml).
    report_hidden_costs: Path | None = None

    # Captures (issue 56; producers opt in with --capture): the most text the table holds (characters; new
    # captures past it are refused), the longest any capture is kept, and regexes redacted again at ingest.
    capture_max_total_chars: int = Field(default=256 * 1024 * 1024, gt=0)
    capture_retention_days: float = Field(default=30.0, gt=0, le=400)
    capture_redact: Annotated[list[str], NoDecode] = Field(default_factory=list)

    @field_validator("capture_redact", mode="before")
    @classmethod
    def _split_patterns(cls, value: object) -> object:
        """A JSON list of regexes (a regex may hold commas, so no comma-separated form)."""
        return json.loads(value) if isinstance(value, str) and value.strip() else ([] if value == "" else value)

    @field_validator("scrape_vllm", mode="before")
    @classmethod
    def _split_urls(cls, value: object) -> object:
        if isinstance(value, str):
            value = value.strip()
            return json.loads(value) if value.startswith("[") else [u.strip() for u in value.split(",") if u.strip()]
        return value

    @cached_property
    def tokens(self) -> TokenTable:
        """The token table, built once per Settings; an unreadable or malformed file raises UsageError."""
        env = {name: getattr(self, f"{role}_token") or "" for role, name in ROLE_ENV.items()}
        return TokenTable.from_sources(env, self.tokens_file)

    @cached_property
    def replica_name(self) -> str:
        from specwatch.collector.leader import default_replica_id

        return self.replica_id or default_replica_id()

    @property
    def database_url_resolved(self) -> str:
        """The SQLAlchemy URL to use: the configured one, else a SQLite file under the data dir."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'specwatch.db').resolve()}"
