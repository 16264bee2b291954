"""specwatch report: the monthly cost-benefit report.

`build` reads a month from the store into frozen data types (`Report`) and JSON; `html`
renders and writes them (it imports the data types, never the reverse), with `plots` drawn as
SVG; `schedule` writes last month's report once a month and hands it to the alert notifiers;
`cli` is `specwatch report`. May import `cost`, `alerts`, `collector` and `specwatch.common`.
"""
