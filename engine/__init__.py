"""specwatch engine."""
