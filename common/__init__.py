"""Helpers every package shares. Imports nothing of ours, so any package may import it.

cli      `UsageError` (one line, exit code 2), `tcp_port`, the producer servers' options
auth     `TokenTable`: the one bearer-token scheme (roles, rotation, tenants), `first_token`
procs    child services: `start_service`, `start_collector`, `stop_process`, `free_port`
bodies   `read_capped`: request and response bodies read up to a byte limit
policy   `LoadSwitch`: speculation on or off by load with hysteresis (engine policy, gateway routing)
http     the OpenAI error body and the control-token guard of the engine and the gateway
"""
