"""specwatch service: the collector's HTTP service, on top of every other package but the engine.

`app.create_app(settings)` builds the FastAPI app: its lifespan opens and migrates the store and
starts the background work (ingest workers, roll-ups and retention, vLLM scrapes, the alert
runner, the monthly report); `deps` holds the typed dependencies; `routes_*` the endpoints
(ingest, queries, alerts and rules, cost, reports); `cli` is `specwatch collector serve`.
May import `collector`, `alerts`, `cost`, `report` and `specwatch.common`; only the CLI imports it.
"""
