"""The gateway: an OpenAI-compatible reverse proxy in front of a team's own engines (vLLM servers,
or our bundled engine), so every specwatch feature works on engines we do not run.

It routes each request to a `spec` (speculative) or a `plain` pool of upstreams (canary split,
load / long-prompt / low-acceptance fallback, failover, control-API override) and sends one
`RequestRecord` per proxied request to the collector through its telemetry sink: timings measured
here, draft counts from the upstream's per-request metrics (vLLM's `metrics.speculative_decoding`,
SGLang's `meta_info`: `sglang`; llama.cpp's `timings`, kept as its figures: `llamacpp`).

Modules: `app` (the ASGI app), `core` (state: upstreams, health, sink), `proxy` (routing a request
to an upstream and relaying the answer), `control` (the control API), `parsing` (reading a client's
request), `records`, `routing`, `upstreams`, `metrics`, `cli`.

Imports: `telemetry` (schema, client, sink) and `common` only.
"""
