"""Ingest: request bodies into rows (`parse`), bulk idempotent writes (`store`), OTLP spans (`otlp`)
and vLLM scrapes (`vllm`)."""
