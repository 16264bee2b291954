"""specwatch dashboard."""
