"""Fixtures shared by all tests: a migrated database per test, SQLite and PostgreSQL.

Migrating a new database costs ~1 s, and ~900 tests take one: the session migrates one template per
backend, and each test that takes `db`, `settings` or `client` gets a copy of it (a file copy; a
PostgreSQL `CREATE DATABASE ... TEMPLATE`). A test that takes `db_url` alone gets an empty database, to
migrate (or not) as it likes.

PostgreSQL: unless SPECWATCH_TEST_POSTGRES_URL names a server, the session starts its own before
collection, sets that variable to it, and removes it at the end (tests/postgres_server.py). Tests take
the URL from the `postgres_url` fixture (or the variable); without server binaries they skip, saying
what to install.

The run ends with its skips counted by reason (`pytest_terminal_summary`), so what did not run shows.

`live_collector` (session): a collector filled with real engine telemetry, shared by the
dashboard and report tests. The bundled model is served by `specwatch engine serve` (a child
process, telemetry to a collector child process, A/B arms, device samples every 0.5 s) and
driven by the traffic generator: grounded scenarios with n-gram drafts, and chat drafted by an
untrained early exit (low acceptance), so every page and report section has something real to show.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from postgres_server import ENV, MISSING, EphemeralPostgres, PostgresError, find_bin_dir
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.exc import DBAPIError
from waiting import wait_for

from specwatch.collector.db import make_db, upgrade
from specwatch.collector.settings import Settings
from specwatch.common.procs import free_port, specwatch_command, start_collector
from specwatch.service.app import create_app

SOURCE_ROOT = Path(__file__).resolve().parents[1]  # the repository

_postgres: EphemeralPostgres | None = None  # the server this session started
_postgres_failed = ""  # why it did not start, where binaries were found


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    """Start PostgreSQL before collection, unless SPECWATCH_TEST_POSTGRES_URL names one: every test,
    module-level reads and child processes included, then finds the variable set (0.5 s here).
    An xdist worker uses the controller's (it inherits the variable)."""
    global _postgres, _postgres_failed
    if os.environ.get(ENV) or hasattr(session.config, "workerinput") or (bin_dir := find_bin_dir()) is None:
        return
    server = EphemeralPostgres(bin_dir)
    atexit.register(server.stop)  # in case the session ends without pytest_sessionfinish
    try:
        os.environ[ENV] = server.start()
        _postgres = server
    except PostgresError as exc:
        server.stop()
        _postgres_failed = f"{exc} (or set {ENV} to a server of your own)"


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    """After the session's fixtures are torn down (Ctrl-C included): stop and remove the server."""
    if _postgres is not None:
        os.environ.pop(ENV, None)
        _postgres.stop()


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """SPECWATCH_TEST_POSTGRES_URL: a server of one's own, or the one this session started."""
    if url := os.environ.get(ENV):
        return url
    if _postgres_failed:
        pytest.fail(_postgres_failed, pytrace=False)
    pytest.skip(MISSING)


def _reset_postgres(url: str) -> None:
    db = make_db(url)
    with db.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    db.dispose()


@pytest.fixture
def empty_postgres(postgres_url: str) -> str:
    """The test PostgreSQL with an empty public schema (no migrations run)."""
    _reset_postgres(postgres_url)
    return postgres_url


MIGRATED = {"db", "settings", "client"}  # fixtures that want the schema at head


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A new database per test: migrated to head where the test takes MIGRATED fixtures, else empty."""
    migrated = not MIGRATED.isdisjoint(request.fixturenames)
    if request.param == "sqlite":
        path = tmp_path / "specwatch.db"
        if migrated:
            shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        return f"sqlite:///{path}"
    url = request.getfixturevalue("postgres_url")
    if migrated and (template := request.getfixturevalue("postgres_template")):
        return _copy_database(url, template, "specwatch_per_test")
    _reset_postgres(url)
    return url


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory) -> Path:
    """A SQLite file migrated to head, copied by every test that wants one."""
    path = tmp_path_factory.mktemp("template") / "specwatch.db"
    db = make_db(f"sqlite:///{path}")
    upgrade(db)
    db.dispose()  # the last connection closed: the WAL is folded into the file
    return path


@pytest.fixture(scope="session")
def postgres_template(postgres_url: str) -> str | None:
    """A database migrated to head on the test server, to copy per test; None where this role may not
    create databases (then each test resets the schema and migrates, as before)."""
    try:
        url = _copy_database(postgres_url, "template0", "specwatch_template")
    except DBAPIError:
        return None
    db = make_db(url)
    upgrade(db)
    db.dispose()
    return "specwatch_template"


def _copy_database(url: str, template: str, name: str) -> str:
    """Database `name` on `url`'s server made anew from `template` (connections to it closed); its URL."""
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    finally:
        admin.dispose()
    return make_url(url).set(database=name).render_as_string(hide_password=False)


@pytest.fixture
def db(db_url: str) -> Engine:
    db = make_db(db_url)
    upgrade(db)
    yield db
    db.dispose()


@pytest.fixture
def settings(db_url: str, tmp_path) -> Settings:
    # The fixed test epoch is months old: keep retention from deleting it under the tests.
    # Ingest runs in threads here (spawning worker processes per test costs ~1 s);
    # test_ingest_workers.py runs it in worker processes, as the service does by default.
    return Settings(
        data_dir=tmp_path, database_url=db_url, max_body_bytes=256 * 1024, retention_days=36500, ingest_processes=0
    )


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def client(settings: Settings, registry: CollectorRegistry) -> TestClient:
    with TestClient(create_app(settings, registry)) as test_client:
        yield test_client


@pytest.fixture(scope="session")
def bundled_engine():
    """The bundled SmolLM2-135M-Instruct in float32 (exactness is a float32 property)."""
    from specwatch.engine.engine import Engine, EngineConfig

    return Engine(EngineConfig(dtype="float32", instance="test"))


@pytest.fixture(scope="session")
def live_collector(tmp_path_factory) -> dict:
    """{"url": the collector's base URL, "db": its SQLite file} (see the module docstring)."""
    from specwatch.traffic import TrafficConfig, run_traffic

    data = tmp_path_factory.mktemp("live")
    port, engine_port = free_port(), free_port()
    collector = start_collector(port, data / "collector.log", f"sqlite:///{data / 'specwatch.db'}")
    url, engine_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{engine_port}"
    db = subprocess.Popen(
        specwatch_command("engine", "serve", "--port", str(engine_port), "--collector", url, "--instance", "laptop")
        + ["--spool-dir", str(data / "spool"), "--canary-fraction", "0.7", "--sample-interval", "0.5"]
        + ["--min-acceptance", "0"],
        env={**os.environ, "PYTHONPATH": str(SOURCE_ROOT)},
        stdout=(data / "engine.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        _wait(lambda: httpx.get(f"{engine_url}/v1/models", timeout=1).status_code == 200, 300, "the engine")
        for scenarios, drafter in ((("grounded", "summary"), "ngram"), (("chat",), "early-exit:2")):
            config = TrafficConfig(
                url=engine_url,
                scenarios=scenarios,
                max_requests=10,
                duration_s=300,
                concurrency=2,
                max_tokens=24,
                drafter=drafter,
            )
            with open(os.devnull, "w") as devnull:
                asyncio.run(run_traffic(config, progress=devnull))
        _wait(
            lambda: httpx.get(f"{url}/v1/signals", params={"last": 3600}).json()["requests"] >= 20, 30, "the telemetry"
        )
        time.sleep(1.0)  # a few more device samples
        yield {"url": url, "db": data / "specwatch.db"}
    finally:
        db.terminate()
        db.wait(30)
        collector.terminate()
        collector.wait(30)


def _wait(condition, timeout_s: float, what: str) -> None:
    """wait_for, with an HTTP error (a server not up yet) counting as not yet."""

    def answered():
        try:
            return condition()
        except httpx.HTTPError:
            return False

    wait_for(answered, what, timeout=timeout_s, interval=0.3)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter):
    """After pytest's own summary: the skips counted by reason (each names what is missing and what
    provides it), and the PostgreSQL this session started, if any."""
    result = yield
    reasons = Counter(_skip_reason(report) for report in terminalreporter.stats.get("skipped", []))
    if reasons:
        terminalreporter.write_sep("-", f"skipped: {sum(reasons.values())}, by reason")
        for reason, count in reasons.most_common():
            terminalreporter.write_line(f"{count:5d}  {reason}")
    if _postgres is not None:
        terminalreporter.write_line(_postgres.describe())
    return result


def _skip_reason(report) -> str:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return reason.removeprefix("Skipped: ").splitlines()[0]
