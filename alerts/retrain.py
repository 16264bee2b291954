"""The retrain hint (issue 56): an alert that recommends draft retraining (`recommend_draft_retraining`:
SpecAcceptanceLow, SpecAcceptanceDrift) on a drafter names the capture slice it concerns and the
commands that turn that slice into a training set, in its annotations, and so in its webhook:

    capture          drafter=early-exit:4 model=smollm2 tag=chat (the first of scenario, tenant)
    capture_url      <external URL>/v1/captures?drafter=...&model=...&series_tag=chat   (admin token)
    retrain_export   specwatch draft export --collector URL --drafter ... --target-model M --out FILE
    retrain_prepare  python scripts/prepare_data.py --model M --data FILE --output DIR   (vLLM speculators)

The slice is the alert's own labels: drafter and model, and for a drift alert its series tag. Label values
come from producers: each is shell-quoted in the commands, and every annotation is made inert text
(`evaluator.as_text`), so a crafted drafter name can neither run in a pasted command nor render as markup.
Captures are off unless producers opt in (`--capture`); the hint says so when the slice may be empty.
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import replace
from urllib.parse import urlencode

from specwatch.alerts.evaluator import Alert, as_text

ACTION = "recommend_draft_retraining"
COLLECTOR_PLACEHOLDER = "$SPECWATCH_COLLECTOR_URL"
MAX_BAND_TOKENS = 999_999_999  # an open band's top, as GET /v1/captures' prompt_tokens=LO-HI takes it (9 digits)


def with_retrain_hints(alerts: dict[str, Alert], external_url: str, tag_keys: tuple[str, ...]) -> dict[str, Alert]:
    """The alerts with their retrain annotations added (alerts on no drafter unchanged)."""
    return {fp: _hinted(alert, external_url, tag_keys) for fp, alert in alerts.items()}


def _hinted(alert: Alert, external_url: str, tag_keys: tuple[str, ...]) -> Alert:
    hints = retrain_annotations(alert.labels, external_url, tag_keys)
    return replace(alert, annotations={**alert.annotations, **hints}) if hints else alert


def retrain_annotations(labels: dict[str, str], external_url: str, tag_keys: tuple[str, ...]) -> dict[str, str]:
    """`capture`, `capture_url`, `retrain_export`, `retrain_prepare` for an alert's labels; {} without a drafter."""
    drafter, model = labels.get("drafter"), labels.get("model")
    if not drafter or drafter == "none" or not model:
        return {}
    query = {"drafter": drafter, "model": model}
    flags = ["--drafter", drafter, "--model", model]
    described = f"drafter={drafter} model={model}"
    if (tag := labels.get("tag")) and tag != "none":
        keys = ",".join(tag_keys)
        query |= {"series_tag": tag, "tag_keys": keys}
        flags += ["--series-tag", tag, "--tag-keys", keys]
        described += f" tag={tag} (the first of {keys} a capture carries)"
    collector = external_url.rstrip("/") or COLLECTOR_PLACEHOLDER
    out = f"capture-{_slug(query)}.jsonl"
    export = ["specwatch", "draft", "export", "--collector", collector, *flags, "--target-model", model, "--out", out]
    prepare = ["python", "scripts/prepare_data.py", "--model", model, "--data", out, "--output", out[:-6]]
    hints = {
        "capture": described,
        "capture_url": f"{collector}/v1/captures?{urlencode(query)}",
        "retrain_export": _shell(export, keep_first=collector == COLLECTOR_PLACEHOLDER),
        "retrain_prepare": _shell(prepare),
    }
    return {key: as_text(value) for key, value in hints.items()}


def slice_export(
    external_url: str, drafter: str, model: str, tenant: str | None, scenario: str | None, band: tuple[int, int | None]
) -> str:
    """The command that exports one acceptance slice's captures (`collector.reads.slices`; a missing tenant or
    scenario tag is `none`, a band [low, high) is `--prompt-tokens low-(high - 1)`), each argument shell-quoted.
    Not HTML-escaped as the annotations are: it travels in JSON and the dashboard shows it as text."""
    low, high = band
    last = MAX_BAND_TOKENS if high is None else high - 1
    query = {"drafter": drafter, "model": model, "tenant": tenant or "none", "scenario": scenario or "none"}
    query["prompt_tokens"] = f"{low}-{last}"
    flags = [arg for key, value in query.items() for arg in (f"--{key.replace('_', '-')}", value)]
    collector = external_url.rstrip("/") or COLLECTOR_PLACEHOLDER
    out = f"capture-{_slug(query)}.jsonl"
    export = ["specwatch", "draft", "export", "--collector", collector, *flags, "--target-model", model, "--out", out]
    return _shell(export, keep_first=collector == COLLECTOR_PLACEHOLDER)


def _shell(argv: list[str], keep_first: bool = False) -> str:
    """The command as one line to paste; the collector placeholder stays an expandable variable."""
    return " ".join(arg if keep_first and arg == COLLECTOR_PLACEHOLDER else shlex.quote(arg) for arg in argv)


def _slug(query: dict[str, str]) -> str:
    """A file name for the slice that no label value can steer (a path, a dot-dot): a hash of it."""
    return hashlib.sha256(repr(sorted(query.items())).encode()).hexdigest()[:12]
