"""README's table of shipped alert rules lists each rule `specwatch alerts check` reports, once (issue 55),
with the action the rules file gives it."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from specwatch.alerts.rules import DEFAULT_RULES

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_rules() -> dict[str, str]:
    """rule -> its action cell, from the table under "## The shipped alert rules"."""
    section = README.read_text().split("## The shipped alert rules", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \|.*\| (.+) \|$", section, flags=re.MULTILINE)
    return dict(rows)


def test_readme_lists_every_shipped_rule_once_with_its_action():
    shipped = yaml.safe_load(DEFAULT_RULES.read_text())["rules"]
    listed = readme_rules()
    assert list(listed) == [rule["name"] for rule in shipped]
    for rule in shipped:
        actions = ", ".join(f"`{a}`" for a in rule["actions"]) or "notify"
        assert listed[rule["name"]] == actions, rule["name"]
