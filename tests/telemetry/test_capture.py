"""A producer's capture step (telemetry.capture): off by default, the policy's slice, redaction before
anything leaves the process, the size caps."""

from __future__ import annotations

import time

import pytest

from specwatch.telemetry.capture import (
    MAX_CAPTURE_CHARS,
    REDACTED,
    CapturePolicy,
    Capturer,
    Redactor,
    _fraction,
    speculators_row,
)
from specwatch.telemetry.schema import RequestRecord
from specwatch.telemetry.sink import TelemetrySink

SECRET = "sk-" + "a1B2" * 8


def record(i: int = 0, drafted: int = 16, accepted: int = 4, **tags: str) -> RequestRecord:
    return RequestRecord(
        request_id=f"req-{i}",
        instance="engine-0",
        model="smollm2",
        drafter="model:tiny",
        mode="speculative",
        started_at=time.time(),
        e2e_s=1.0,
        prompt_tokens=40,
        output_tokens=20,
        num_drafts=4 if drafted else 0,
        num_draft_tokens=drafted,
        num_accepted_tokens=accepted,
        accepted_per_position=[max(0, min(4, accepted - 4 * i)) for i in range(4)] if drafted else [],
        gamma=4 if drafted else 0,
        tags={"tenant": "acme", "scenario": "chat", **tags},
    )


PROMPT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"my key is {SECRET}, fix it"}]


def hook_upper(text: str) -> str:
    return text.replace("fix", "FIX")


def hook_fails(text: str) -> str:
    raise RuntimeError("hook down")


def test_capture_is_off_by_default():
    sink, kept = TelemetrySink("engine-0"), []
    sink.capture_client = type("Keep", (), {"submit": staticmethod(kept.append)})()
    sink.capture(record(), PROMPT, "done", "chat")
    assert not CapturePolicy().enabled and not sink.wants_capture("req-0", {"tenant": "acme"}) and kept == []


def test_redaction_runs_before_the_capture_is_made():
    redact = Redactor.of([r"sk-[A-Za-z0-9]{20,}"], f"{__name__}:hook_upper")
    capture = Capturer(CapturePolicy(rate=1.0), redact).capture(record(), PROMPT, f"use {SECRET}", "chat")
    assert SECRET not in capture.model_dump_json()
    assert capture.prompt[1].content == f"my key is {REDACTED}, FIX it" and capture.output == f"use {REDACTED}"
    assert capture.redactions == 2 and capture.tenant == "acme"


def test_a_failing_hook_keeps_nothing():
    capturer = Capturer(CapturePolicy(rate=1.0), Redactor.of(hook=f"{__name__}:hook_fails"))
    assert capturer.capture(record(), PROMPT, "out", "chat") is None and capturer.dropped_hook == 1


@pytest.mark.parametrize(
    "spec, message",
    [("rate=2", "rate must be in"), ("tenant=acme", "needs rate"), ("rate=0.1,colour=red", "unknown capture option")],
)
def test_bad_policies_are_refused_with_a_reason(spec, message):
    with pytest.raises(ValueError, match=message):
        CapturePolicy.parse(spec)
    with pytest.raises(ValueError, match="not MODULE:FUNCTION"):
        Redactor.of(hook="nocolon")


def test_the_policy_selects_its_slice():
    policy = CapturePolicy.parse("rate=1,tenant=acme,tag=scenario:chat,below-acceptance=0.5,prompt-tokens=10-100")
    assert policy.keeps(record(accepted=4))  # 4/16 < 0.5
    assert not policy.keeps(record(accepted=12))  # acceptance 0.75
    assert not policy.keeps(record(drafted=0, accepted=0))  # nothing drafted: no low acceptance to learn from
    assert not policy.keeps(record(tenant="globex")) and not policy.keeps(record(scenario="code"))
    assert not policy.keeps(record().model_copy(update={"prompt_tokens": 500}))


def test_the_rate_samples_by_request_id_the_same_everywhere():
    policy = CapturePolicy(rate=0.25)
    chosen = [i for i in range(4000) if policy.selects(f"req-{i}", {})]
    assert 850 < len(chosen) < 1150  # ~25%
    assert chosen == [i for i in range(4000) if _fraction(f"req-{i}") < 0.25]  # a pure function of the id


def test_a_huge_hostile_text_is_capped_not_kept_whole():
    capturer = Capturer(CapturePolicy(rate=1.0, max_chars=1000, max_total_chars=2500), Redactor.of([r"x+y"]))
    huge = [{"role": "user", "content": "x" * 5_000_000}] * 100  # 500 MB of prompt, 100 messages
    started = time.perf_counter()
    capture = capturer.capture(record(), huge, "z" * 10_000_000, "chat")
    assert time.perf_counter() - started < 1.0  # the regexes never scan the whole text
    assert capture.truncated and len(capture.prompt) == 64 and len(capture.output) == 1000
    assert all(len(m.content) <= 1000 for m in capture.prompt)
    assert capturer.capture(record(1), PROMPT, "more", "chat") is None and capturer.dropped_budget == 1  # total cap
    assert MAX_CAPTURE_CHARS >= 1000


def test_a_chat_capture_becomes_a_speculators_conversation():
    capture = Capturer(CapturePolicy(rate=1.0)).capture(record(), PROMPT, "fixed", "chat").model_dump()
    row = speculators_row(capture, "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert row["conversations"][-1] == {"role": "assistant", "content": "fixed"}
    assert [t["role"] for t in row["conversations"]] == ["system", "user", "assistant"]
    assert speculators_row({**capture, "kind": "completion"}, "m") is None
