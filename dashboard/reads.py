"""What the pages read: each service of `services`, `fleet` and `cost_service`, cached and guarded
(`state.cached`: a collector problem is a banner, not a traceback). Pages call these functions."""

from __future__ import annotations

from specwatch.dashboard import (
    acceptance_service,
    alerts_service,
    cost_service,
    fleet,
    requests_service,
    services,
    speculation_service,
    tuning_service,
)
from specwatch.dashboard.state import cached

overview = cached(services.overview)
series = cached(services.series)
acceptance_series = cached(services.acceptance_series)
positions = cached(services.positions)
acceptance_definitions = cached(acceptance_service.definitions)
lost_slices = cached(acceptance_service.lost_slices)
length_points = cached(services.length_points)
length_within_scenarios = cached(services.length_within_scenarios)
breakdown = cached(services.breakdown)
cdfs = cached(services.cdfs)
compare = cached(services.compare)
throughput_by_load = cached(services.throughput_by_load)
power_by_mode = cached(services.power_by_mode)
thresholds = cached(services.thresholds)
alerts = cached(services.alerts)
rules = cached(services.rules)
alert_history = cached(alerts_service.alert_history)

devices = cached(fleet.devices)
sampled_energy = cached(fleet.sampled_energy)
events = cached(fleet.events)
deploy_markers = cached(fleet.deploy_markers)
sources = cached(fleet.sources)
vllm_signals = cached(fleet.vllm_signals)
speculation_activity = cached(speculation_service.speculation_activity)

cost = cached(cost_service.cost)
cost_daily = cached(cost_service.cost_daily)
report_html = cached(cost_service.report_html)

tuning = cached(tuning_service.tuning)

request_list = cached(requests_service.request_list)
request_detail = cached(requests_service.request_detail)
