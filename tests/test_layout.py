"""The package layout holds: imports point one way (a table of allowed edges), no module imports
itself back through others, and the tree passes `ruff check` and `ruff format --check`.

Imports are read with `ast`, so a lazy import inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# layers, bottom to top: the shared helpers, the telemetry contract, the collector, what reads it, the
# service on top of those, and the CLI on top of everything. A package may import only what sits below it.
PACKAGES = (
    "common",
    "telemetry",
    "engine",
    "gateway",
    "collector",
    "cost",
    "alerts",
    "report",
    "service",
    "dashboard",
    "specwatch",
)
LEAF = {"common"}
PRODUCER = {"telemetry", "common"}
# package -> the packages of ours it may import
ALLOWED = {
    "common": set(),
    "telemetry": {"common"},
    "engine": PRODUCER,
    "gateway": PRODUCER,
    "collector": PRODUCER,
    "cost": {"collector", *PRODUCER},
    "alerts": {"cost", "collector", *PRODUCER},  # its cost signal calls the cost model's formula
    "report": {"cost", "alerts", "collector", *PRODUCER},
    "service": {"collector", "alerts", "cost", "report", *PRODUCER},
    "dashboard": LEAF,
    "specwatch": set(PACKAGES),
}
# ORM rows never leave the collector: only it (its migrations included) imports its models
ORM_MODULE = "specwatch.collector.models"


def module_name(path: Path) -> str:
    """`collector/ingest/store.py` -> `specwatch.collector.ingest.store`; `specwatch/cli.py` -> `specwatch.cli`."""
    parts = path.relative_to(REPO).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join(parts if parts[0] == "specwatch" else ("specwatch", *parts))


def package_of(module: str) -> str | None:
    """The layer a module of ours belongs to (`specwatch.cost.model` -> `cost`, `specwatch.up` -> `specwatch`)."""
    parts = module.split(".")
    if parts[0] != "specwatch":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGES else "specwatch"


def source_modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for package in PACKAGES
        if (REPO / package).is_dir()
        for path in sorted((REPO / package).rglob("*.py"))
    }


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """Our modules that `path` imports: `from a import b` names `a.b` when that is a module of ours."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base]).strip(".")
            found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names}
    return {module for module in found if package_of(module)}


def import_graph() -> dict[str, set[str]]:
    modules = source_modules()
    return {name: imported_modules(name, path, set(modules)) for name, path in modules.items()}


def allowed(importer: str, imported: str) -> bool:
    source, target = package_of(importer), package_of(imported)
    return source == target or target in ALLOWED[source]


def test_imports_point_one_way():
    wrong = sorted(
        f"{importer} imports {imported}"
        for importer, imports in import_graph().items()
        for imported in imports
        if not allowed(importer, imported)
    )
    assert not wrong, "imports against the allowed edges (tests/test_layout.py ALLOWED):\n" + "\n".join(wrong)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle among our modules (depth-first search), or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node], _ = "open", stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node], _ = "done", stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_orm_models_stay_in_the_collector():
    leaks = sorted(
        importer
        for importer, imports in import_graph().items()
        if ORM_MODULE in imports and package_of(importer) != "collector"
    )
    assert not leaks, f"{ORM_MODULE} imported outside the collector: {leaks}"


def test_no_wheels_are_tracked():
    tracked = subprocess.run(["git", "ls-files", "*.whl"], capture_output=True, text=True, cwd=REPO).stdout.split()
    assert not tracked, f"binary wheels committed: {tracked}"


def test_the_checks_catch_what_they_guard(tmp_path):
    """The edge table refuses an upward import and the cycle finder finds a cycle."""
    assert not allowed("specwatch.collector.reads.queries", "specwatch.alerts.rules")
    assert not allowed("specwatch.cost.measured", "specwatch.alerts.store") and allowed(
        "specwatch.alerts.measures", "specwatch.cost.signals"
    )
    assert not allowed("specwatch.engine.server", "specwatch.collector.ingest.store")
    assert not allowed("specwatch.gateway.app", "specwatch.collector.schema")
    assert not allowed("specwatch.common.auth", "specwatch.telemetry.schema")
    assert not allowed("specwatch.telemetry.client", "specwatch.cli")
    assert allowed("specwatch.engine.server", "specwatch.telemetry.schema") and allowed(
        "specwatch.report.html", "specwatch.report.build"
    )
    assert allowed("specwatch.up", "specwatch.engine.cli") and allowed(
        "specwatch.collector.ingest.store", "specwatch.common.auth"
    )
    assert find_cycle({"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}}) == ["a.x", "a.y", "a.z", "a.x"]
    assert find_cycle({"a.x": {"a.y"}, "a.y": set()}) is None


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff_passes(command):
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed (it is in the dev extra: pip install -e '.[dev]')")
    result = subprocess.run([ruff, *command, "--no-cache", str(REPO)], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
