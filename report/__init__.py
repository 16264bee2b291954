"""specwatch report: the monthly cost-benefit report.

`build` reads a month from the store into frozen data types (`Report`) and JSON; `html`
renders and writes them (it imports the data types, never the reverse), with `plots` drawn as
SVG; `schedule` writes last month's report once a month; `delivery` puts its link into the alerts'
webhook outbox (its payload, Slack text and once-per-month key); `cli` is `specwatch report`.
May import `cost`, `alerts`, `collector`, `telemetry` and `common`.
"""
