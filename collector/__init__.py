"""specwatch collector: the telemetry contract, the producer client, ingest, the SQL store and queries.

Holds the contract (`schema`, no heavy imports), the producer client and its spool, ingest,
the store and its migrations, roll-ups and retention, the query layer, Prometheus metrics and
the vLLM scraper; nothing about money, reports or alerts. May import `specwatch.common` only.

Producers: `telemetry.schema` (RequestRecord, DeviceSample, EngineEvent) and
`telemetry.client.TelemetryClient` (batching, retries, fsynced disk spool).

The HTTP service on top of it is `service.app.create_app(Settings())`, run by
`specwatch collector serve` (`POST /v1/ingest`, `GET /v1/...`, `/metrics`); schema with
`specwatch db upgrade` (Alembic, `collector/migrations`).

Reading (functions take an Engine, a `queries.Window` and `queries.Filters`, and return
frozen dataclasses; ORM rows never leave the package):
  queries.signals                exact window signals from raw rows
  window_signals.signals         the same from per-second aggregates written at ingest (sketch percentiles)
  long_signals.auto_signals      aggregates up to 6 hours (raw rows with tag filters), rollups beyond
  queries.per_position_acceptance, queries.acceptance_vs_length, queries.errors_by_hour
  history.errors_by_hour_long    errors by hour of day, from hourly rollups for long windows
  series.series / history.auto_series   per-step series (raw rows / rollups beyond 6 hours)
  series.latest_device_samples, series.engine_events
  vllm.vllm_signals              acceptance and latency percentiles of scraped vLLM engines
"""
