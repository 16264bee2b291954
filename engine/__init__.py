"""specwatch engine: a lossless speculative-decoding engine on torch + transformers.

Models and drafters, the speculative loop, the scheduler and its policy, the OpenAI-compatible
server and control API, the device sampler and one telemetry sink. The only package that
imports torch; of ours it may import only `telemetry` and `common`. Only the CLI (`specwatch`)
imports it.
"""
