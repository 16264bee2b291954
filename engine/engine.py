"""The engine: a loaded target model, its drafters, and one request at a time through the loop.

`Engine.stream(request)` yields text as it is generated and ends with the request's
telemetry record; `Engine.generate(request)` collects it all.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from collector.schema import RequestRecord
from engine.decoder import make_decoder
from engine.drafters import Drafter, NgramConfig, NgramDrafter, early_exit_drafter, model_drafter
from engine.loading import BUNDLED, LoadedModel, load_model
from engine.sampling import SamplingParams
from engine.speculative import DecodeStats, SpeculativeDecoder


@dataclass(frozen=True)
class EngineConfig:
    model: str = BUNDLED
    dtype: str = "auto"
    device: str = "cpu"
    threads: int = 0  # 0: every core
    cache_dir: Path | None = None
    instance: str = field(default_factory=socket.gethostname)
    ngram: NgramConfig = NgramConfig()


@dataclass(frozen=True)
class GenerateRequest:
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None  # chat: rendered with the tokenizer's template
    max_tokens: int = 128
    drafter: str | None = "ngram"  # 'ngram' | 'model:PATH' | 'early-exit:K' | None (plain decoding)
    gamma: int = 8
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()
    seed: int | None = None
    tags: dict[str, str] = field(default_factory=dict)
    request_id: str | None = None

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        if not 1 <= self.max_tokens <= 32_768:
            raise ValueError(f"max_tokens must be in [1, 32768], got {self.max_tokens}")
        if not 0 <= self.gamma <= 64:
            raise ValueError(f"gamma must be in [0, 64], got {self.gamma}")


@dataclass(frozen=True)
class GenerateResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # 'stop' | 'length'
    record: RequestRecord


class Engine:
    def __init__(self, config: EngineConfig = EngineConfig()) -> None:
        self.config = config
        torch.set_num_threads(config.threads or os.cpu_count() or 1)
        self.target: LoadedModel = load_model(config.model, config.dtype, config.device, config.cache_dir)
        self.decoder = make_decoder(self.target.model)
        self.tokenizer = self.target.tokenizer
        self.stop_ids = _stop_token_ids(self.target)
        self._drafters: dict[str, Drafter] = {}

    def drafter(self, spec: str | None) -> Drafter | None:
        """The drafter named by `spec`, built once and reused across requests."""
        if spec in (None, "", "none"):
            return None
        if spec not in self._drafters:
            self._drafters[spec] = self._build_drafter(spec)
        return self._drafters[spec]

    def _build_drafter(self, spec: str) -> Drafter:
        kind, _, arg = spec.partition(":")
        if kind == "ngram" and not arg:
            return NgramDrafter(self.config.ngram)
        if kind == "early-exit" and arg.isdigit():
            return early_exit_drafter(self.target.model, int(arg))
        if kind == "model" and arg:
            draft = load_model(arg, _dtype_name(self.target.dtype), str(self.target.device), self.config.cache_dir)
            return model_drafter(draft.model, self.target.model, draft.name)
        raise ValueError(f"unknown drafter {spec!r}: use none, ngram, model:PATH or early-exit:K")

    def encode(self, request: GenerateRequest) -> list[int]:
        if request.messages is not None:
            ids = self.tokenizer.apply_chat_template(request.messages, add_generation_prompt=True, tokenize=True)
            return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        return self.tokenizer(request.prompt, add_special_tokens=True)["input_ids"]

    def generate(self, request: GenerateRequest) -> GenerateResult:
        *_, result = self.stream(request)
        return result

    def stream(self, request: GenerateRequest) -> Iterator[str | GenerateResult]:
        """Yield text deltas as tokens are committed, then the GenerateResult."""
        started_at, started = time.time(), time.monotonic()
        prompt_ids = self.encode(request)
        drafter = self.drafter(request.drafter) if request.gamma > 0 else None
        loop = SpeculativeDecoder(self.decoder, drafter, self.target.device)
        loop.prefill(prompt_ids, request.max_tokens, request.gamma, request.sampling, self.stop_ids, request.seed)
        ttft = time.monotonic() - started
        text = _TextStream(self.tokenizer, request.stop)
        delta = text.update(loop.tokens[len(prompt_ids) :])
        if delta:
            yield delta
        while not loop.finished and not text.stopped:
            loop.step()
            if delta := text.update(loop.tokens[len(prompt_ids) :]):
                yield delta
        if tail := text.flush():
            yield tail
        generated = loop.tokens[len(prompt_ids) :]
        finish = "stop" if text.stopped or (generated and generated[-1] in self.stop_ids) else "length"
        record = self._record(request, drafter, loop.stats, started_at, ttft, time.monotonic() - started, len(prompt_ids), len(generated))
        yield GenerateResult(text.text, generated, finish, record)

    def _record(self, request, drafter, stats: DecodeStats, started_at, ttft, e2e, prompt_tokens, output_tokens) -> RequestRecord:
        return RequestRecord(
            request_id=request.request_id or uuid.uuid4().hex,
            instance=self.config.instance,
            model=self.target.name,
            drafter=drafter.name if drafter else None,
            mode="speculative" if drafter else "autoregressive",
            started_at=started_at,
            ttft_s=ttft,
            e2e_s=e2e,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            num_drafts=stats.num_drafts,
            num_draft_tokens=stats.num_draft_tokens,
            num_accepted_tokens=stats.num_accepted_tokens,
            accepted_per_position=stats.accepted_per_position,
            gamma=stats.gamma,
            draft_s=stats.draft_s,
            verify_s=stats.verify_s,
            tags=dict(request.tags),
        )


class _TextStream:
    """Incremental detokenisation that holds back text which may still become a stop string
    or an incomplete UTF-8 character."""

    def __init__(self, tokenizer, stop: tuple[str, ...]) -> None:
        self.tokenizer, self.stop = tokenizer, tuple(s for s in stop if s)
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.text, self.sent, self.stopped = "", 0, False

    def update(self, token_ids: list[int]) -> str:
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


def _stop_token_ids(target: LoadedModel) -> frozenset[int]:
    ids = {target.tokenizer.eos_token_id}
    eos = getattr(target.model.generation_config, "eos_token_id", None)
    ids.update(eos if isinstance(eos, list) else [eos])
    return frozenset(i for i in ids if i is not None)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
