"""specwatch: the CLI that wires engine, collector, alerts and dashboard together."""
