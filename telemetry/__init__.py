"""specwatch telemetry: the contract every producer and the collector share, and the producer side.

  schema   RequestRecord, DeviceSample, EngineEvent, IngestBatch (pydantic, no heavy imports)
  client   TelemetryClient: batching, retries with backoff, an fsynced disk spool while the collector is down
  spool    the spool's file format
  sink     TelemetrySink: the one place a producer (the engine, the gateway) hands its records to
  spans    RequestSpans: one OpenTelemetry span per request, OTLP/HTTP out (the SDK imported only when on)
  ratios   the derived ratios, defined once
  clamps   impossible engine counts clamped and flagged (`spec_clamped`), one rule for every adapter

Raw counts travel; ratios are derived when read. Imports only `common` of ours, so the engine and
the gateway depend on this package and never on the collector.
"""
