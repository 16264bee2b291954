"""The dashboard's reads are plain functions with typed answers: pages call `dashboard.reads`
by name (no string dispatch), every read is used by a page, and every service is used."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from specwatch.dashboard import cost_service, fleet, reads, services
from specwatch.dashboard.services import Signals

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboard"
VIEWS = sorted((DASHBOARD / "views").glob("*.py"))
SIGNALS = {
    "requests": 120,
    "errors": 2,
    "active_s": 240.0,
    "request_rate_per_s": 0.5,
    "output_tokens": 6000,
    "output_tokens_per_s": 25.0,
    "drafts": 480,
    "draft_tokens": 1920,
    "accepted_tokens": 1200,
    "acceptance_rate": 0.625,
    "mean_acceptance_length": 3.5,
    "ttft": {"p50": 0.05, "p90": 0.1, "p95": 0.12, "p99": 0.2, "count": 120},
}


def names_used(paths: list[Path]) -> set[str]:
    """Every name and attribute the files read."""
    used = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                used.add(node.attr)
            elif isinstance(node, ast.Name):
                used.add(node.id)
    return used


def reads_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "reads"
    }


def test_pages_read_through_plain_functions_that_exist():
    defined = {name for name, value in vars(reads).items() if callable(value) and not name.startswith("_")}
    called = set().union(*(reads_in(path) for path in VIEWS))
    assert called <= defined, called - defined
    assert defined - {"cached"} <= called, f"reads no page uses: {defined - {'cached'} - called}"
    assert not any("fetch(" in path.read_text() for path in VIEWS)


@pytest.mark.parametrize("module", [services, fleet, cost_service])
def test_every_service_is_used_by_the_dashboard(module):
    public = {
        name
        for name, value in vars(module).items()
        if inspect.isfunction(value) and value.__module__ == module.__name__ and not name.startswith("_")
    }
    others = [p for p in DASHBOARD.rglob("*.py") if p != Path(module.__file__)]
    own = names_used([Path(module.__file__)]) - public | {n for n in public if _called_inside(module, n)}
    assert public <= names_used(others) | own, public - names_used(others) - own


def _called_inside(module, name: str) -> bool:
    tree = ast.parse(Path(module.__file__).read_text())
    return any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == name for n in ast.walk(tree))


def test_signals_carry_the_collectors_rates_and_rate_counts_over_its_span():
    s = Signals.of(SIGNALS)
    assert (s.request_rate_per_s, s.output_tokens_per_s, s.active_s) == (0.5, 25.0, 240.0)
    assert s.per_s(s.drafts) == 2.0 and s.per_s(s.accepted_tokens) == 5.0  # per the collector's active_s
    assert s.accepted_share_of_output == 0.2
    assert (s.ttft.p50, s.ttft.p99) == (0.05, 0.2)
    idle = Signals.of(SIGNALS | {"requests": 0, "active_s": 0.0, "output_tokens": 0})
    assert idle.per_s(0) is None and idle.accepted_share_of_output is None


def test_a_collector_without_the_rates_is_an_error_not_a_guess():
    with pytest.raises(KeyError, match="active_s"):
        Signals.of({k: v for k, v in SIGNALS.items() if k != "active_s"})
