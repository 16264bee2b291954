"""The wheel holds one namespace, and the monitoring install (no extra) runs without the engine's packages.

The no-extra install is made for real: the wheel built from this tree is installed with
`pip install --no-deps --target`, and the interpreter runs with `-S` over this venv's site-packages less
the `[engine]` extra's distributions, so `import torch` fails there as it does after `pip install specwatch`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from specwatch.common.errors import ENGINE_MODULES
from specwatch.common.procs import free_port, start_service, stop_process

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("common", "telemetry", "engine", "gateway", "collector", "cost", "alerts", "report", "service", "dashboard")
# what the engine extra brings, as top-level names in site-packages (torch's own helpers included)
ENGINE_DISTRIBUTIONS = (*ENGINE_MODULES, "ninja", "torchgen", "functorch", "nvidia", "triton", "sympy", "mpmath")


# imported by the check below: every module of the wheel but these (the engine, Streamlit pages, migrations, `-m`)
NOT_MONITORING = (
    "specwatch.engine",
    "specwatch.dashboard.app",
    "specwatch.dashboard.views",
    "specwatch.collector.migrations",
    "specwatch.__main__",
)
IMPORT_ALL = """
import importlib, pkgutil, sys, specwatch
names = [m.name for m in pkgutil.walk_packages(specwatch.__path__, "specwatch.") if not m.name.startswith({skip!r})]
for name in names:
    importlib.import_module(name)
loaded = sorted(set(sys.modules) & set({engine!r}))
assert not loaded, loaded
print(len(names), "modules")
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the tree (setuptools writes its build/ folder beside the sources)."""
    source, out = tmp_path_factory.mktemp("source") / "specwatch", tmp_path_factory.mktemp("wheel")
    skipped = shutil.ignore_patterns(".*", "data", "build", "__pycache__", "*.egg-info", "tests", "bench", "docs")
    shutil.copytree(REPO, source, ignore=skipped)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q", "-w", str(out)],
        check=True,
        capture_output=True,
    )
    (found,) = out.glob("specwatch-*.whl")
    return found


@pytest.fixture(scope="module")
def monitoring_env(wheel, tmp_path_factory) -> dict[str, str]:
    """PYTHONPATH of a no-extra install: the wheel, then this venv's packages less the engine extra's."""
    root = tmp_path_factory.mktemp("monitoring")
    target, site = root / "specwatch", root / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )
    site.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name.lower()
        engine_part = name.split("-")[0].split(".")[0] in ENGINE_DISTRIBUTIONS
        if not (engine_part or name.startswith(("specwatch", "__editable__")) or name.endswith(".pth")):
            (site / entry.name).symlink_to(entry)
    return {"PYTHONPATH": f"{target}:{site}", "PATH": "/usr/bin:/bin", "HOME": str(root)}


def run_monitoring(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run there, outside the tree (the working directory comes first on the path)."""
    return subprocess.run(
        [sys.executable, "-S", "-P", *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=env["HOME"]
    )


def test_the_wheel_holds_the_specwatch_namespace_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"specwatch", "specwatch-0.1.0.dist-info"}
    expected = {
        "specwatch/" + str(path.relative_to(REPO))
        for folder in FOLDERS
        for path in (REPO / folder).rglob("*")
        if path.suffix in (".py", ".cpp", ".h", ".yaml", ".toml", ".html", ".mako", ".json")
        and "__pycache__" not in path.parts
    }
    assert expected - set(names) == set(), "files of the tree missing from the wheel"


def test_the_monitoring_install_imports_no_engine_package(monitoring_env):
    """Every module outside the engine imports with torch & co. absent, and none of them is loaded."""
    check = IMPORT_ALL.format(skip=NOT_MONITORING, engine=ENGINE_MODULES)
    result = run_monitoring(monitoring_env, "-c", check)
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.split()[0]) > 100
    assert "/monitoring" in run_monitoring(monitoring_env, "-c", "import specwatch; print(specwatch.__file__)").stdout


@pytest.mark.parametrize(
    "command", [["engine", "serve"], ["generate", "--prompt", "hi"], ["up", "--once"]], ids=lambda c: c[0]
)
def test_engine_commands_name_the_extra_without_it(monitoring_env, command):
    result = run_monitoring(monitoring_env, "-m", "specwatch", *command)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "pip install 'specwatch[engine]'" in result.stderr and "Traceback" not in result.stderr


def test_collector_and_gateway_serve_without_the_engine_extra(monitoring_env, tmp_path):
    collector_port, gateway_port = free_port(), free_port()
    python = [sys.executable, "-S", "-P", "-m", "specwatch"]  # -P: not the working directory first
    collector = start_service(
        "collector",
        [*python, "collector", "serve", "--port", str(collector_port), "--db", f"sqlite:///{tmp_path / 'c.db'}"],
        monitoring_env,
        tmp_path / "collector.log",
        f"http://127.0.0.1:{collector_port}/readyz",
        60,
    )
    try:
        gateway = start_service(
            "gateway",
            [*python, "gateway", "serve", "--port", str(gateway_port), "--upstream", "p=http://127.0.0.1:9"],
            monitoring_env,
            tmp_path / "gateway.log",
            f"http://127.0.0.1:{gateway_port}/metrics",  # /health answers 503 while no upstream is up
            60,
        )
        stop_process(gateway, timeout_s=20)
    finally:
        stop_process(collector, timeout_s=20)
    assert "torch" not in (tmp_path / "collector.log").read_text() + (tmp_path / "gateway.log").read_text()
