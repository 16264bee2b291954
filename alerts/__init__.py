"""specwatch alerts."""
