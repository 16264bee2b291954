"""Build the Grafana dashboards: `python -m specwatch.grafana [--rules FILE]` rewrites both JSON files.

specwatch.json reads the collector's /metrics (collector/metrics.py; scrape it with
`honor_labels: true` so `instance` names the engine instance). specwatch-vllm.json shows the
same panels over vLLM's native metrics; a panel whose metric vLLM lacks (output tokens, the
drafter label, acceptance moments, device gauges) is left out there, and per-position
acceptance exists only there. Panels are data: a title, a type, a unit, the alert signal whose
threshold they draw, and the queries, written once against a `Source` naming each flavour's metrics.

Thresholds are not written here: they are the alert rules' own, taken from the loaded rules (an
`alerts.rules.AlertConfig`, which the CLI loads and validates: the shipped rules or yours with
`--rules FILE`; this package reads no rules file and imports nothing of alerts), so the line drawn is
the line the rule uses, red on the side where the rule fires.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple, Protocol

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "[$__rate_interval]"

SOURCES = {
    "specwatch.json": {
        "uid": "specwatch",
        "title": "specwatch: speculative decoding",
        "model": "model",
        "split": "mode",
        "description": "specwatch collector /metrics; scrape it with honor_labels: true (instance = engine instance).",
        "requests": "specwatch_requests_total",
        "drafts": "specwatch_drafts_total",
        "draft_tokens": "specwatch_draft_tokens_total",
        "accepted": "specwatch_accepted_tokens_total",
        "output": "specwatch_output_tokens_total",
        "oom": "specwatch_oom_errors_total",
        "drafter": "drafter",
        "moments": "specwatch_acceptance_rate_{}_total",
        "ttft": "specwatch_time_to_first_token_seconds",
        "e2e": "specwatch_e2e_request_latency_seconds",
        "fragmentation": "specwatch_device_fragmentation_ratio",
        "reserved": "specwatch_device_memory_reserved_bytes",
        "power": "specwatch_device_power_watts",
        "util_draft": "specwatch_device_util_draft_ratio",
        "signal": "{}",
    },
    "specwatch-vllm.json": {
        "uid": "specwatch-vllm",
        "title": "specwatch: speculative decoding (vLLM metrics)",
        "model": "model_name",
        "description": "vLLM's native /metrics (v1 spec_decode counters); instance is the scrape target.",
        "split": "model_name",
        "requests": "vllm:e2e_request_latency_seconds_count",
        "drafts": "vllm:spec_decode_num_drafts_total",
        "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
        "accepted": "vllm:spec_decode_num_accepted_tokens_total",
        "per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        "ttft": "vllm:time_to_first_token_seconds",
        "e2e": "vllm:e2e_request_latency_seconds",
        "signal": "vllm_{}",
    },
}
DRAFTED = 'drafter!="none"'  # autoregressive requests: no drafts, so 0 / 0
DEVICE = ("fragmentation", "reserved", "power", "util_draft")  # labels instance, device: no model to filter on


class Source:
    """PromQL over one flavour's metrics; a key it lacks raises KeyError and drops the panel."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names

    def __getitem__(self, key: str) -> str:
        return self.names[key]

    def sel(self, key: str, suffix: str = "", extra: str = "", fmt: str = "") -> str:
        filters = ['instance=~"$instance"']
        if key not in DEVICE:
            filters.append(f'{self["model"]}=~"$model"')
        metric = self[key].format(fmt) + suffix
        return metric + "{" + ", ".join(filters + ([extra] if extra else [])) + "}"

    def rate(self, key: str, by: str = "", fn: str = "rate", window: str = RATE, **kw: str) -> str:
        return f"sum{f' by ({by})' if by else ''} ({fn}({self.sel(key, **kw)}{window}))"

    def quantile(self, q: float, key: str) -> str:
        return f"histogram_quantile({q}, sum by (le) (rate({self.sel(key, '_bucket')}{RATE})))"

    def stddev(self, by: str, extra: str) -> str:
        """sqrt(E[x^2] - E[x]^2) of per-request acceptance, from the collector's moment counters."""
        sq, s, n = (self.rate("moments", by, fmt=m, extra=extra) for m in ("squares", "sum", "requests"))
        return f"sqrt(clamp_min({sq} / {n} - ({s} / {n}) ^ 2, 0))"


def legend(label: str) -> str:
    return "{{" + label + "}}"


class Panel(NamedTuple):
    title: str
    type: str  # timeseries | stat
    unit: str
    targets: Callable[[Source], list[tuple[str, str]]]  # -> [(expr, legend)]
    threshold: str | None = None  # the alert signal whose rule's threshold the panel draws


ROWS: dict[str, list[Panel]] = {
    "Overview": [
        Panel(
            "Acceptance rate",
            "stat",
            "percentunit",
            lambda s: [(f"{s.rate('accepted')} / {s.rate('draft_tokens')}", "acceptance")],
            "acceptance_rate",
        ),
        Panel(
            "Mean acceptance length",
            "stat",
            "none",
            lambda s: [(f"1 + {s.rate('accepted')} / {s.rate('drafts')}", "tokens per draft")],
        ),
        Panel(
            "Share of output tokens from accepted drafts",
            "stat",
            "percentunit",
            lambda s: [(f"{s.rate('accepted')} / {s.rate('output')}", "from drafts")],
        ),
        Panel("Requests/s", "timeseries", "reqps", lambda s: [(s.rate("requests", s["split"]), legend(s["split"]))]),
        Panel("Output tokens/s", "timeseries", "none", lambda s: [(s.rate("output", s["split"]), legend(s["split"]))]),
        Panel(
            "Drafted & accepted tokens/s",
            "timeseries",
            "none",
            lambda s: [(s.rate("draft_tokens"), "drafted"), (s.rate("accepted"), "accepted")],
        ),
    ],
    "Acceptance": [
        Panel(
            "Acceptance rate by drafter",
            "timeseries",
            "percentunit",
            lambda s: [
                (
                    f"{s.rate('accepted', s['drafter'], extra=DRAFTED)}"
                    f" / {s.rate('draft_tokens', s['drafter'], extra=DRAFTED)}",
                    legend("drafter"),
                )
            ],
            "acceptance_rate",
        ),
        Panel(
            "Per-request acceptance stddev",
            "timeseries",
            "none",
            lambda s: [(s.stddev(s["drafter"], DRAFTED), legend("drafter"))],
            "acceptance_stddev",
        ),
        Panel(
            "Acceptance by draft position",
            "timeseries",
            "percentunit",
            lambda s: [
                (
                    f"{s.rate('per_pos', 'position')} / on () group_left () {s.rate('drafts')}",
                    "position " + legend("position"),
                )
            ],
        ),
    ],
    "Latency": [
        Panel(
            "Time to first token P50 / P99",
            "timeseries",
            "s",
            lambda s: [(s.quantile(0.5, "ttft"), "P50"), (s.quantile(0.99, "ttft"), "P99")],
            "ttft_p99",
        ),
        Panel("End-to-end latency P99", "timeseries", "s", lambda s: [(s.quantile(0.99, "e2e"), "P99")]),
    ],
    "Memory": [
        Panel(
            "OOM errors in range",
            "stat",
            "none",
            lambda s: [(s.rate("oom", fn="increase", window="[$__range]"), "OOM errors")],
        ),
        Panel(
            "Fragmentation ratio",
            "timeseries",
            "none",
            lambda s: [(s.sel("fragmentation"), "{{instance}} {{device}}")],
            "fragmentation",
        ),
        Panel("Memory reserved", "timeseries", "bytes", lambda s: [(s.sel("reserved"), "{{instance}} {{device}}")]),
        Panel("Power", "timeseries", "watt", lambda s: [(s.sel("power"), "{{instance}} {{device}}")]),
        Panel(
            "Draft model utilisation",
            "timeseries",
            "percentunit",
            lambda s: [(s.sel("util_draft"), "{{instance}} {{device}}")],
        ),
    ],
}
HEIGHT = {"stat": 5, "timeseries": 8}  # timeseries take 12 of the 24 columns; a row's stats share one line


class Rule(Protocol):
    signal: str
    op: str
    threshold: float


class Rules(Protocol):
    """What the builder reads of loaded alert rules (`alerts.rules.AlertConfig`)."""

    rules: Iterable[Rule]


class Limit(NamedTuple):
    value: float
    bad: str  # "above" | "below": the side where the rule fires


def rule_thresholds(config: Rules) -> dict[str, Limit]:
    """Signal -> the threshold of the rule on it that fires first (the lowest `>` or the highest `<`
    threshold), as the Streamlit dashboard picks it."""
    found: dict[str, Limit] = {}
    for rule in config.rules:
        bad = "above" if rule.op.startswith(">") else "below"
        earlier = min if bad == "above" else max
        previous = found.get(rule.signal, Limit(rule.threshold, bad))
        found[rule.signal] = Limit(earlier(previous.value, rule.threshold), bad)
    return found


def thresholds(limit: Limit | None) -> dict:
    if limit is None:
        steps = [{"color": "green", "value": None}]
    elif limit.bad == "above":
        steps = [{"color": "green", "value": None}, {"color": "red", "value": limit.value}]
    else:
        steps = [{"color": "red", "value": None}, {"color": "green", "value": limit.value}]
    return {"mode": "absolute", "steps": steps}


def panel(p: Panel, source: Source, limits: dict[str, Limit]) -> dict | None:
    try:
        queries = p.targets(source)
    except KeyError:
        return None  # this flavour lacks a metric or label the panel needs
    limit = limits.get(source["signal"].format(p.threshold)) if p.threshold else None
    defaults = {"unit": p.unit, "thresholds": thresholds(limit), "color": {"mode": "thresholds"}}
    options: dict = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}, "colorMode": "value"}
    if p.type == "timeseries":
        defaults["color"] = {"mode": "palette-classic"}
        defaults["custom"] = {"thresholdsStyle": {"mode": "off" if limit is None else "line"}}
        options = {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}}
    return {
        "type": p.type,
        "title": p.title,
        "datasource": DS,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": leg}
            for i, (expr, leg) in enumerate(queries)
        ],
    }


def layout(source: Source, limits: dict[str, Limit]) -> list[dict]:
    """Rows top to bottom, empty ones left out; each run of same-type panels fills lines left to right."""
    panels: list[dict] = []
    y = 0
    for row, defs in ROWS.items():
        built = [b for b in (panel(p, source, limits) for p in defs) if b]
        if not built:
            continue
        panels.append(
            {
                "type": "row",
                "title": row,
                "collapsed": False,
                "datasource": DS,
                "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
                "panels": [],
            }
        )
        stats = sum(b["type"] == "stat" for b in built)
        x, y, line_h = 0, y + 1, 0
        for i, b in enumerate(built):
            w = 12 if b["type"] == "timeseries" else max(6, 24 // stats)
            if x + w > 24 or (i and b["type"] != built[i - 1]["type"]):
                x, y, line_h = 0, y + line_h, 0
            b["gridPos"] = {"x": x, "y": y, "w": w, "h": HEIGHT[b["type"]]}
            panels.append(b)
            x, line_h = x + w, max(line_h, HEIGHT[b["type"]])
        y += line_h
    for pid, p in enumerate(panels, 1):
        p["id"] = pid
    return panels


def variable(name: str, label: str, query: str) -> dict:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-variable"},
        "refresh": 2,
        "sort": 1,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"},
    }


def dashboard(names: dict[str, str], rules: Rules) -> dict:
    """One flavour's dashboard, its thresholds from the loaded alert `rules`."""
    source = Source(names)
    requests, model = names["requests"], names["model"]
    return {
        "uid": names["uid"],
        "title": names["title"],
        "description": names["description"],
        "tags": ["specwatch", "speculative-decoding"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "timezone": "browser",
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "annotations": {"list": []},
        "templating": {
            "list": [
                {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus"},
                variable("instance", "Instance", f"label_values({requests}, instance)"),
                variable("model", "Model", f'label_values({requests}{{instance=~"$instance"}}, {model})'),
            ]
        },
        "panels": layout(source, rule_thresholds(rules)),
    }


def write(rules: Rules, out: Path = HERE) -> list[Path]:
    """Write every flavour's dashboard into `out`; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for file, names in SOURCES.items():
        (path := out / file).write_text(json.dumps(dashboard(names, rules), indent=2) + "\n")
        written.append(path)
    return written
