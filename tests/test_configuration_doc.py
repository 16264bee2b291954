"""docs/configuration.md names every environment variable the product reads."""

from __future__ import annotations

import re

from test_layout import PACKAGES, REPO

from specwatch.collector.settings import Settings

TABLE = (REPO / "docs" / "configuration.md").read_text()


def documented() -> set[str]:
    return set(re.findall(r"^\| `(SPECWATCH_[A-Z0-9_]+)` \|", TABLE, re.M))


def read_in_code() -> set[str]:
    names = set()
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            names |= set(re.findall(r"\bSPECWATCH_[A-Z0-9]+(?:_[A-Z0-9]+)*\b", path.read_text()))
    return {name for name in names if not name.startswith("SPECWATCH_TEST_")}


def test_every_settings_field_is_documented():
    fields = {f"SPECWATCH_{name.upper()}" for name in Settings.model_fields}
    assert fields - documented() == set()


def test_every_variable_in_the_code_is_documented():
    assert read_in_code() - documented() == set()


def test_the_table_names_nothing_the_code_does_not_read():
    fields = {f"SPECWATCH_{name.upper()}" for name in Settings.model_fields}
    assert documented() - read_in_code() - fields == set()
