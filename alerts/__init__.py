"""specwatch alerts: rules with Prometheus semantics over the collector's signals.

`rules` (YAML rules and receivers), `signals` (one entry per signal: its store computation from
`measures` and its PromQL from `promql`), `evaluator` (a pure state machine, `evaluate(now, signals)`),
`tables` (the alerts' own tables; the collector's migrations create them), `store` (alert state and
history), `notify` (webhooks through a persistent outbox), `actions` (remediation on the engine or
gateway), `runner` (one evaluation cycle after another), `prometheus` (export as a Prometheus rule
file), `cli` (`specwatch alerts`). May import `collector`, `telemetry` and `common`; never the
collector's ORM models (it reads the store through `collector.reads.reads` and the window readers).
"""
