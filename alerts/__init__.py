"""specwatch alerts: rules with Prometheus semantics over the collector's signals.

`rules` (YAML rules and receivers), `signals` (window signals read from the store), `evaluator`
(a pure state machine, `evaluate(now, signals)`), `store` (alert state and history), `notify`
(webhooks through a persistent outbox), `actions` (remediation on the engine or gateway),
`runner` (one evaluation cycle after another), `prometheus` (export as a Prometheus rule file),
`cli` (`specwatch alerts`). May import `collector` and `specwatch.common`.
"""
