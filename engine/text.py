"""Incremental detokenisation of one request's output, for streaming."""

from __future__ import annotations

import threading


class TextStream:
    """Incremental detokenisation that holds back text which may still become a stop string
    or an incomplete UTF-8 character."""

    def __init__(self, tokenizer, stop: tuple[str, ...], lock: threading.Lock) -> None:
        self.tokenizer, self.stop, self.lock = tokenizer, tuple(s for s in stop if s), lock
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.text, self.sent, self.stopped = "", 0, False

    def update(self, token_ids: list[int]) -> str:
        with self.lock:
            self.text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        for stop in self.stop:
            if (cut := self.text.find(stop)) >= 0:
                self.text, self.stopped = self.text[:cut], True
        ready = len(self.text) if self.stopped else len(self.text) - self.hold
        if self.text.endswith("\ufffd") and not self.stopped:
            ready = min(ready, len(self.text) - 1)
        return self._emit(ready)

    def flush(self) -> str:
        return self._emit(len(self.text))

    def _emit(self, upto: int) -> str:
        if upto <= self.sent:
            return ""
        delta, self.sent = self.text[self.sent : upto], upto
        return delta
