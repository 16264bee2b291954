"""The reads consumers call: window signals and series per tier (`reader` picks the tier), the
dashboard's breakdowns, and what alerts, the cost model, the tuner and the report read."""
