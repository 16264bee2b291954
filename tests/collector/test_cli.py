"""`specwatch db upgrade` and the collector's settings from the environment."""

from __future__ import annotations

from sqlalchemy import inspect

from specwatch.cli import main
from specwatch.collector.db import make_db
from specwatch.collector.settings import Settings


def test_db_upgrade_creates_the_schema(db_url, capsys):
    assert main(["db", "upgrade", "--db", db_url]) == 0
    assert "newest schema" in capsys.readouterr().out
    db = make_db(db_url)
    assert {"requests", "device_samples", "engine_events", "request_rollups", "vllm_scrapes"} <= set(
        inspect(db).get_table_names()
    )
    db.dispose()
    assert main(["db", "upgrade", "--db", db_url]) == 0  # idempotent


def test_bad_database_url_is_a_usage_error(capsys):
    assert main(["db", "upgrade", "--db", "not a url"]) == 2
    assert "not a database URL" in capsys.readouterr().err
    assert main(["db", "upgrade", "--db", "postgresql+psycopg://nobody@127.0.0.1:1/none"]) == 2
    assert "cannot reach the database" in capsys.readouterr().err


def test_settings_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECWATCH_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("SPECWATCH_SCRAPE_VLLM", "http://a:8000/metrics, http://b:8000/metrics")
    monkeypatch.setenv("SPECWATCH_INGEST_TOKEN", "t")
    settings = Settings()
    assert settings.scrape_vllm == ["http://a:8000/metrics", "http://b:8000/metrics"]
    assert settings.database_url_resolved == f"sqlite:///{tmp_path.resolve() / 'specwatch.db'}"
    monkeypatch.setenv("SPECWATCH_SCRAPE_VLLM", '["http://c/metrics"]')
    monkeypatch.setenv("SPECWATCH_DATABASE_URL", "postgresql+psycopg://u@h/db")
    assert (
        Settings().scrape_vllm == ["http://c/metrics"]
        and Settings().database_url_resolved == "postgresql+psycopg://u@h/db"
    )


def test_bad_setting_in_the_environment_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setenv("SPECWATCH_INGEST_PROCESSES", "abc")
    assert main(["collector", "serve", "--port", "18199"]) == 2
    err = capsys.readouterr().err
    assert "SPECWATCH_INGEST_PROCESSES" in err and "'abc'" in err and "Traceback" not in err
    monkeypatch.setenv("SPECWATCH_INGEST_PROCESSES", "-1")
    assert main(["db", "upgrade"]) == 2
    assert (
        "SPECWATCH_INGEST_PROCESSES: Input should be greater than or equal to 0 (got '-1')" in capsys.readouterr().err
    )
