"""specwatch collector."""
