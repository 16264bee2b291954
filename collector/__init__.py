"""specwatch collector: ingest, the SQL store and its migrations, roll-ups and retention, the read path.

Arranged by storage tier, in the order data flows:
  ingest/   request bodies into rows (`parse`), bulk idempotent writes (`store`, with the per-second
            aggregates of each batch), OTLP spans (`otlp`), engine scrapes (`vllm`, one `exposition` schema
            per engine: `sglang_metrics`, `llamacpp_metrics`, `trtllm_metrics`), TensorRT-LLM perf-metrics
            files (`trtllm_perf`)
  tiers/    raw rows (day `partitions` on PostgreSQL), per-second `aggregates`, per-minute and hourly
            `rollups` and retention; one aggregate definition and one merge of acceptance spreads
            (`aggregates.totals_of`, `aggregates.merge_m2`), one `sketch` and one `totals` type for all
  reads/    what consumers call (below)
and beside them the store itself (`models`, `db`, Alembic migrations under `collector/migrations`,
`settings`), the `leader` replica that runs `maintenance` (roll-ups, retention), Prometheus `metrics`.
It holds no cost formula and renders no report. The alert tables are created by its migrations (0004)
but defined, read and written by `alerts/` (alerts/tables.py); retention expires them through
`alerts.store.expire_history`, which the service hands to the maintenance loop.
Imports only `telemetry` (the contract producers use) and `common` (shared helpers).

The HTTP service on top of it is `service.app.create_app(Settings())`, run by
`specwatch collector serve` (`POST /v1/ingest`, `GET /v1/...`, `/metrics`); schema with
`specwatch db upgrade`.

Reading (functions take the database handle `db`, a `queries.Window` and `queries.Filters`, and return frozen
dataclasses; ORM rows never leave the package):
  reader.signals, reader.series  the tiered read path: raw rows (tag filters), per-second aggregates
                                 up to 6 h, rollups beyond; percentiles from one DDSketch type in
                                 every tier (`sketch`), TPOT included
  reader.totals, reader.label_values, reader.positions, reader.acceptance_vs_length,
  reader.errors_by_hour, reader.population
                                 grouped totals, filter choices, and the per-request figures of a
                                 large window from a sample of time slices (marked `sampled`)
  totals.Totals, totals.signals_from
                                 the one totals type every tier returns and the one Signals builder
  window_signals.WindowReader    the per-second tier, each piece read once per alert cycle
  long_signals.long_signals, history.long_series, history.errors_by_hour_long
                                 the rollup tier (raw rows for the parts not rolled up)
  queries.signals, series.series exact raw-row signals and series (tag filters; tests compare tiers to them)
  breakdown.breakdown, breakdown.compare, breakdown.throughput_by_load, breakdown.device_series,
  breakdown.sources              the dashboard's group-wise views
  series.latest_device_samples, series.engine_events
  vllm.vllm_signals              acceptance and latency percentiles of scraped engines (vLLM, SGLang,
                                 llama.cpp, TensorRT-LLM)
  reads.*, detector_reads.*      what alert signals, change detectors, the report and the vLLM check read
  usage.*                        what the cost model reads (columns and rows; the formulas live in cost/)
"""
