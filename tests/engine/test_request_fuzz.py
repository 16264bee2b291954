"""Property: whatever body arrives at /v1/completions or /v1/chat/completions, the engine (bundled model,
real HTTP) never answers 5xx, a streamed answer never carries a server error, and every refusal is in
OpenAI's error shape. Valid bodies generate at most a few tokens, so the fuzz stays fast."""

from __future__ import annotations

import json

import httpx
import pytest
from engine_harness import BackgroundServer
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from specwatch.engine.policy import PolicyConfig
from specwatch.engine.scheduler import SchedulerConfig

TEXT = st.text(max_size=40) | st.text(alphabet="a-:\x00\u2028é\U0001f600<|>", max_size=8)
LONG_TEXT = st.sampled_from(["x" * 100_000, "word " * 30_000, "é" * 3_000_000, ""])
NUMBERS = (
    st.integers(min_value=-(2**100), max_value=2**100)
    | st.floats()
    | st.sampled_from([0, -1, 1, 2**63, 2**64, -(2**63) - 1, 1e308, float("nan"), float("inf")])
)
JSON_SCALARS = st.none() | st.booleans() | NUMBERS | TEXT
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
# Values a valid request may take are kept small (tokens, lookahead, drafter depth): the rest are refused.
SMALL_OR_INVALID = st.integers(-3, 4) | st.integers(8_200, 2**100) | JSON_VALUES
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "developer", "wizard"]), "content": TEXT}
)
FIELD_VALUES = {
    "max_tokens": SMALL_OR_INVALID,
    "max_completion_tokens": SMALL_OR_INVALID,
    "gamma": SMALL_OR_INVALID,
    "drafter": st.sampled_from(
        ["none", "ngram", "auto", "early-exit:1", "early-exit:2", "early-exit:0", "early-exit:31", "early-exit:-1"]
        + ["early-exit:²", "early-exit:", "model:/etc/passwd", "model:/etc", "model:bundled", "model:", "", "NGRAM"]
    )
    | JSON_VALUES,
    "prompt": TEXT | LONG_TEXT | st.lists(TEXT, max_size=3) | JSON_VALUES,
    "messages": st.lists(MESSAGE, max_size=4) | st.just([{"role": "user", "content": "hi"}] * 3_000) | JSON_VALUES,
    "stop": TEXT | st.lists(TEXT, max_size=6) | JSON_VALUES,
    "tags": st.dictionaries(TEXT, TEXT, max_size=20) | JSON_VALUES,
}
FIELDS = sorted(FIELD_VALUES) + ["model", "temperature", "top_p", "top_k", "n", "stream", "seed", "user", "logprobs"]


@st.composite
def mutated_bodies(draw) -> dict:
    """A valid body with a few fields replaced, removed or added."""
    chat = draw(st.booleans())
    body = {"messages": [{"role": "user", "content": "Hi"}]} if chat else {"prompt": "Hi"}
    body |= {"max_tokens": 2, "temperature": 0}
    for _ in range(draw(st.integers(1, 3))):
        field = draw(st.sampled_from(FIELDS) | st.text(min_size=1, max_size=8))
        if draw(st.booleans()) and field in body:
            del body[field]
        else:
            body[field] = draw(FIELD_VALUES.get(field, JSON_VALUES))
    return body


BODIES = (
    st.builds(lambda v: json.dumps(v).encode(), mutated_bodies())
    | st.builds(lambda v: json.dumps(v).encode(), JSON_VALUES)
    | st.binary(max_size=64)
)


@pytest.fixture(scope="module")
def http(bundled_engine):
    server = BackgroundServer(bundled_engine, SchedulerConfig(slots=2, max_queue=8), PolicyConfig())
    with server, httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=BODIES, path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
def test_random_bodies_never_give_5xx(http, body, path):
    response = http.post(path, content=body, headers={"content-type": "application/json"})
    event(f"status {response.status_code}")
    assert response.status_code < 500, (response.status_code, response.text[:2000])
    if response.status_code == 200:
        assert "server_error" not in response.text, response.text[:2000]
    else:
        error = response.json()["error"]
        assert error["message"] and error["type"] and (error["param"] is None or isinstance(error["param"], str))
