"""A whole (non-streamed) upstream answer too large to hold: passed on as it arrives, keeping only its tail.

Up to `GatewaySettings.whole_response_bytes` an answer is read whole and checked before the client gets
it (a malformed one is a 502). A larger one is relayed chunk by chunk once that much has arrived, so the
gateway holds at most that head plus `TAIL_BYTES`, whatever the answer's size (a 64 MiB answer held whole
left the gateway's RSS 137 MB up). The record's `usage` and `metrics` are top-level keys after `choices`
in both vLLM's answers and our engine's, so they are read from the tail. Past `max_response_bytes` the
answer is cut off (the client sees a truncated body, the record `upstream:too_large`).
"""

from __future__ import annotations

import json

from specwatch.common.bodies import TooLarge

TAIL_BYTES = 64 * 1024  # usage + metrics (the acceptance histogram included) are a few KB
_DECODER = json.JSONDecoder()
_BEFORE_KEY = "{, \t\r\n"  # what may precede a key's opening quote (inside a string a quote is escaped)


class WholeReader:
    """The SseReader's interface for a whole JSON answer: bytes pass unchanged, the tail is kept."""

    saw_content = False  # no first token to time: the record takes the upstream's own TTFT
    usage = metrics = meta_info = timings = None  # known only once the whole answer is through (`note`)
    done = False  # no end marker: only the answer's last byte finishes it

    def __init__(self, limit: int) -> None:
        self.limit, self.size = limit, 0
        self.head, self.tail = b"", b""

    def feed(self, data: bytes) -> bytes:
        self.size += len(data)
        if self.size > self.limit:
            raise TooLarge
        if len(self.head) < 64:
            self.head += data[:64]
        self.tail = (self.tail + data)[-TAIL_BYTES:]
        return data

    def rest(self) -> bytes:
        return b""

    def delivered_usage(self) -> None:
        return None  # a whole answer cut short: its usage was in the part that never came

    def broken(self, message: str) -> bytes | None:
        """Nothing can be said in-band inside a JSON body: the connection is cut, the body left incomplete."""
        return None

    def note(self, outcome) -> None:
        """The outcome's usage and metrics from the tail; `upstream:malformed` unless it looks like one object."""
        if not (self.head.lstrip().startswith(b"{") and self.tail.rstrip().endswith(b"}")):
            outcome.status, outcome.error = "error", "upstream:malformed"
            return
        text = self.tail.decode("utf-8", "ignore")  # 'ignore': a character cut at the tail's start
        outcome.usage, outcome.metrics = top_level_object(text, "usage"), top_level_object(text, "metrics")
        outcome.meta_info = top_level_object(text, "meta_info")
        outcome.timings = top_level_object(text, "timings")


def top_level_object(text: str, key: str) -> dict | None:
    """The object under the last `"key":` of `text` that is a key (not inside a string) and is followed by
    `,` or `}`; None when there is none."""
    at = len(text)
    while (at := text.rfind(f'"{key}"', 0, at)) > 0:
        if text[at - 1] in _BEFORE_KEY and (value := _value_after(text, at + len(key) + 2)) is not None:
            return value
    return None


def _value_after(text: str, at: int) -> dict | None:
    while at < len(text) and text[at].isspace():
        at += 1
    if text[at : at + 1] != ":":
        return None
    at += 1
    while at < len(text) and text[at].isspace():
        at += 1
    try:
        value, end = _DECODER.raw_decode(text, at)
    except ValueError:
        return None
    return value if isinstance(value, dict) and text[end:].lstrip()[:1] in (",", "}") else None
