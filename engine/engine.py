"""The engine: a loaded target model, its drafters, and one request at a time through the loop.

`Engine.stream(request)` yields text as it is generated and ends with the request's
telemetry record; `Engine.generate(request)` collects it all.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specwatch.engine import kernels
from specwatch.engine.cuda import Streams, apply_memory_fraction, check_memory_fraction
from specwatch.engine.decoder import LlamaDecoder, make_decoder, pool_caches, warm_up
from specwatch.engine.device_time import record_source
from specwatch.engine.draft_head import FeatureHead, HeadDrafter, is_head, load_head
from specwatch.engine.draft_vocab import load_vocabulary
from specwatch.engine.drafters import Drafter, NgramConfig, NgramDrafter, early_exit_drafter, model_drafter
from specwatch.engine.loading import BUNDLED, LoadedModel, load_model, resolve_device
from specwatch.engine.lookahead import DEFAULT_DRAFT_FLOOR, CostCurve, check_draft_floor
from specwatch.engine.sampling import SamplingParams
from specwatch.engine.speculative import DEFAULT_LOOKAHEAD, LOOKAHEAD_MODES, DecodeStats, SpeculativeDecoder
from specwatch.engine.suffix import MODEL_FREE, SuffixCache, SuffixConfig, SuffixDrafter
from specwatch.engine.text import TextStream
from specwatch.engine.threads import CpuShare, physical_cores, using
from specwatch.telemetry.schema import RequestRecord


@dataclass(frozen=True)
class EngineConfig:
    model: str = BUNDLED
    dtype: str = "auto"
    device: str = "cpu"
    threads: int = 0  # 0: the physical cores other processes leave free, per forward (engine/threads.py)
    batch_threads: int = 0  # a forward of several requests; 0: as `threads`
    cache_dir: Path | None = None
    instance: str = field(default_factory=socket.gethostname)
    ngram: NgramConfig = NgramConfig()
    suffix: SuffixConfig = SuffixConfig()  # the `suffix` drafter; max_requests: finished outputs it remembers
    memory_fraction: float = 0.8  # CUDA: cap of the caching allocator (set_per_process_memory_fraction)
    max_prompt_tokens: int | None = None  # None: what the model's context leaves after max_tokens
    lookahead: str = DEFAULT_LOOKAHEAD  # how each round's draft length is chosen (engine/speculative.py)
    compile: bool = False  # CPU, float32 or bf16 packed for oneDNN: forwards after a prefix through torch.compile
    draft_floor: float = DEFAULT_DRAFT_FLOOR  # 'cost': the least chance of a verified token (LookaheadModel.floor)

    def __post_init__(self) -> None:
        check_memory_fraction(self.memory_fraction)
        if self.lookahead not in LOOKAHEAD_MODES:
            raise ValueError(f"lookahead must be one of {', '.join(LOOKAHEAD_MODES)}, got {self.lookahead!r}")
        check_draft_floor(self.draft_floor)
        if self.threads < 0 or self.batch_threads < 0:
            raise ValueError(f"threads and batch_threads must be >= 0, got {self.threads} and {self.batch_threads}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")


SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts
CHARS_PER_TOKEN = 16  # a prompt longer than this many characters per allowed token is refused untokenised


class RequestError(ValueError):
    """A request the engine refuses: `param` names the field (the OpenAI error's `param`), `code` the kind."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.code = param, code


@dataclass(frozen=True)
class GenerateRequest:
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None  # chat: rendered with the tokenizer's template
    max_tokens: int = 128
    # 'ngram' | 'suffix' | 'model:PATH' | 'early-exit:K' | 'auto' (scheduler: the policy picks) | None (plain)
    drafter: str | None = "ngram"
    gamma: int = 8
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False  # vLLM's: the model's stop tokens do not end the request (max_tokens or a stop string do)
    min_tokens: int = 0  # vLLM's: no stop token can be chosen before this many output tokens
    tags: dict[str, str] = field(default_factory=dict)
    request_id: str | None = None
    started_at: float | None = None  # epoch s; a gateway's, given with its request_id (else arrival here)

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        if not 1 <= self.max_tokens <= 32_768:
            raise RequestError(f"max_tokens must be in [1, 32768], got {self.max_tokens}", "max_tokens")
        if not 0 <= self.min_tokens <= self.max_tokens:
            message = f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}"
            raise RequestError(message, "min_tokens")
        if not 0 <= self.gamma <= 64:
            raise RequestError(f"gamma must be in [0, 64], got {self.gamma}", "gamma")
        if self.seed is not None and not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise RequestError(f"seed must be in [-2**63, 2**64 - 1], got {self.seed}", "seed")


@dataclass(frozen=True)
class Delta:
    """Text a step made ready for the client, and the request's output tokens so far (a stream's
    `continuous_usage_stats`)."""

    text: str
    tokens: int


@dataclass(frozen=True)
class GenerateResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # 'stop' | 'length'
    record: RequestRecord


class Slot:
    """A decoding lane: its own KV caches (target and drafters); the weights are shared."""

    def __init__(self, engine: Engine) -> None:
        self.decoder = make_decoder(engine.target.model, for_compile=engine.config.compile)
        if engine.config.compile and getattr(self.decoder, "compilable", False):
            self.decoder.compiled = True
        self.drafters: dict[str, Drafter] = {}


class Engine:
    def __init__(self, config: EngineConfig = EngineConfig()) -> None:
        kernels.chosen()  # SPECWATCH_CPU_KERNELS names kernels that exist (ValueError: a usage error at start)
        self.config = config
        self.threads = config.threads or physical_cores()  # the most a forward takes
        self.batch_threads = config.batch_threads or self.threads
        self.cpu_share = None if config.threads else CpuShare()  # None: the counts are fixed
        torch.set_num_threads(self.threads)
        # before the weights land, so they count against the cap; on a CPU: not applicable (recorded)
        self.memory_fraction = apply_memory_fraction(resolve_device(config.device), config.memory_fraction)
        self.target: LoadedModel = load_model(config.model, config.dtype, config.device, config.cache_dir)
        self.tokenizer = self.target.tokenizer
        # Rust tokenizers can fail with "Already borrowed" when one instance is used from two
        # threads at once (the server encodes on its event loop, the scheduler decodes).
        self.tokenizer_lock = threading.Lock()
        self.stop_ids = _stop_token_ids(self.target)
        self._draft_models: dict[str, LoadedModel] = {}
        self._heads: dict[str, FeatureHead] = {}  # feature heads (engine/draft_head.py) by path
        self.streams = Streams(self.target.device)  # target high, draft low priority (CUDA; CPU: no-ops)
        self.default_slot = Slot(self)
        # seconds spent compiling the decode step at start (None: not compiled); see engine/decoder.py
        self.compile_s = self._compile() if config.compile else None
        # seconds per target forward against batch size and rows: its slots' lookaheads read it, the
        # scheduler shares batched forwards' time out by it (engine/device_time.py)
        self.step_costs = CostCurve()
        # the `suffix` drafter's memory of finished outputs, shared by every slot; fed once one is built
        self.suffix_cache = SuffixCache(config.suffix)
        self._suffix_learns = False

    def forward_threads(self, batched: bool = False) -> int:
        """Torch threads for the next forward (of several requests verified at once: `batched`):
        --threads / --batch-threads where set, else the cores other processes leave free."""
        most = self.batch_threads if batched else self.threads
        if self.cpu_share is None or (batched and self.config.batch_threads):
            return most
        return min(most, self.cpu_share.threads())

    def make_slots(self, count: int, batch: bool = True) -> list[Slot]:
        """`count` decoding lanes for a scheduler. Compiled and batching, their target caches share
        one pool, so that a round verifies every lane's rows in one compiled forward (`CachePool`)."""
        slots = [Slot(self) for _ in range(count)]
        if batch and self.compile_s is not None:
            with using(self.batch_threads):  # Inductor fixes a kernel's thread count when it compiles it
                self.compile_s += pool_caches([slot.decoder for slot in slots])
        return slots

    def _compile(self) -> float:
        if not getattr(self.default_slot.decoder, "compiled", False):
            raise ValueError(
                "compile: the compiled forwards are the Llama fast path's on a CPU, in float32 or in bfloat16 "
                f"where oneDNN packs its weights; this engine runs {self.target.dtype} on {self.target.device} "
                f"with {type(self.default_slot.decoder).__name__}"
            )
        try:
            return warm_up(self.default_slot.decoder)
        except torch._dynamo.exc.TorchDynamoException as exc:  # e.g. no C++ compiler for Inductor's CPU kernels
            raise ValueError(f"compile: torch.compile failed ({type(exc).__name__}: {str(exc)[:300]})") from exc

    def drafter(self, spec: str | None, slot: Slot | None = None) -> Drafter | None:
        """The drafter named by `spec` for `slot`, built once per slot (draft weights are loaded once)."""
        if spec in (None, "", "none"):
            return None
        if spec == "auto":
            raise ValueError("drafter 'auto' is chosen per request by the server's policy (specwatch engine serve)")
        slot = slot or self.default_slot
        if spec not in slot.drafters:
            slot.drafters[spec] = self._build_drafter(spec, slot)
        return slot.drafters[spec]

    def add_drafter(self, spec: str, drafter: Drafter) -> None:
        """Use a drafter built elsewhere (e.g. an in-memory draft model) under `spec` on the default slot."""
        self.default_slot.drafters[spec] = drafter

    def check_drafter(self, spec: str | None) -> None:
        """Raise ValueError for a drafter spec that cannot be built (without building it)."""
        if spec in (None, "", "none", "auto") or spec in self.default_slot.drafters:
            return  # 'auto': the server's policy picks a drafter per request
        kind, arg = _parse_drafter(spec)
        layers = self.target.model.config.num_hidden_layers
        if kind == "early-exit" and not 1 <= int(arg) <= layers:
            raise RequestError(f"early exit after {arg} layers: the model has {layers}", "drafter")
        if kind == "model" and not (arg in self._draft_models or arg == "bundled" or Path(arg).exists()):
            raise RequestError(f"draft model not found: {arg}", "drafter")

    def _build_drafter(self, spec: str, slot: Slot) -> Drafter:
        kind, arg = _parse_drafter(spec)
        if kind == "ngram":
            return NgramDrafter(self.config.ngram)
        if kind == "suffix":
            self._suffix_learns = True
            return SuffixDrafter(self.suffix_cache)
        if kind == "early-exit":
            return early_exit_drafter(self.target.model, int(arg))
        if is_head(Path(arg)):
            return self._head_drafter(Path(arg), slot)
        if arg not in self._draft_models:
            self._draft_models[arg] = load_model(
                arg, _dtype_name(self.target.dtype), str(self.target.device), self.config.cache_dir
            )
        draft = self._draft_models[arg]
        vocab = self.target.model.get_output_embeddings().weight.shape[0]
        to_target = load_vocabulary(Path(arg), vocab) if Path(arg).is_dir() else None  # a reduced draft vocabulary
        return model_drafter(draft.model, self.target.model, draft.name, to_target)

    def _head_drafter(self, path: Path, slot: Slot) -> HeadDrafter:
        """A feature head (engine/draft_head.py) over `slot`'s target decoder, its weights loaded once."""
        if not isinstance(slot.decoder, LlamaDecoder):
            raise ValueError(f"{path}: a feature head needs the engine's Llama decoder for the target's states")
        if str(path) not in self._heads:
            self._heads[str(path)] = load_head(path, self.target.model).to(self.target.device)
        head = self._heads[str(path)]
        vocab = self.target.model.get_output_embeddings().weight.shape[0]
        return HeadDrafter(head, slot.decoder, f"model:{path.name}", vocab)

    def learn(self, prompt: list[int], output: list[int]) -> None:
        """A request finished: the `suffix` drafter's shared trie learns its output (once that drafter is in use)."""
        if self._suffix_learns:
            self.suffix_cache.learn(prompt, output)

    @property
    def context_tokens(self) -> int:
        """The model's context length (its config's max_position_embeddings)."""
        return int(getattr(self.target.model.config, "max_position_embeddings", None) or 2**31)

    def prompt_limit(self, max_tokens: int) -> int:
        """The most prompt tokens a request may bring: the context less max_tokens, capped by max_prompt_tokens."""
        room = self.context_tokens - max_tokens
        return min(room, self.config.max_prompt_tokens) if self.config.max_prompt_tokens else room

    def encode(self, request: GenerateRequest) -> list[int]:
        """The prompt's token ids; RequestError (code context_length_exceeded) when it does not fit.

        A prompt of more than CHARS_PER_TOKEN characters per allowed token is refused before tokenising."""
        limit, param = self.prompt_limit(request.max_tokens), "prompt" if request.messages is None else "messages"
        chars = len(request.prompt) if request.messages is None else sum(len(m["content"]) for m in request.messages)
        if chars > CHARS_PER_TOKEN * max(limit, 0):
            raise self._too_long(f"{chars} characters", limit, request.max_tokens, param)
        ids = self._tokenize(request)
        if len(ids) > limit:
            raise self._too_long(f"{len(ids)} tokens", limit, request.max_tokens, param)
        if not ids:
            raise RequestError("the prompt is empty", param)
        return ids

    def _too_long(self, size: str, limit: int, max_tokens: int, param: str) -> RequestError:
        cap = f", --max-prompt-tokens {self.config.max_prompt_tokens}" if self.config.max_prompt_tokens else ""
        return RequestError(
            f"the prompt has {size}; this server accepts at most {max(limit, 0)} prompt tokens with "
            f"max_tokens={max_tokens} (model context {self.context_tokens} tokens{cap}): shorten the prompt "
            "or lower max_tokens",
            param,
            "context_length_exceeded",
        )

    def _tokenize(self, request: GenerateRequest) -> list[int]:
        if request.messages is not None:
            with self.tokenizer_lock:
                ids = self.tokenizer.apply_chat_template(request.messages, add_generation_prompt=True, tokenize=True)
            return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        with self.tokenizer_lock:
            return self.tokenizer(request.prompt, add_special_tokens=True)["input_ids"]

    def generate(self, request: GenerateRequest) -> GenerateResult:
        *_, result = self.stream(request)
        return result

    def stream(self, request: GenerateRequest) -> Iterator[str | GenerateResult]:
        """Yield text deltas as tokens are committed, then the GenerateResult."""
        run = Run(self, request, self.default_slot)
        with using(self.forward_threads()):
            delta = run.timed(run.prefill)
        if delta:
            yield delta
        while not run.finished:
            with using(self.forward_threads()):
                delta = run.timed(run.advance)
            if delta:
                yield delta
        yield run.result()


class Run:
    """One request in flight on a slot: `prefill()` once, then `advance()` until `finished`.

    The scheduler interleaves the runs of several slots one round at a time. A run that retries a failed
    one (`retry_of`) is recorded in the mode it was admitted in: see `retry_of`.
    """

    def __init__(
        self,
        engine: Engine,
        request: GenerateRequest,
        slot: Slot,
        *,
        speculate: bool = True,
        mode_reason: str = "default",
        arm: str | None = None,
        queue_s: float = 0.0,
        load: float | None = None,
        prompt_ids: list[int] | None = None,
        arrived: float | None = None,
    ) -> None:
        self.engine, self.request, self.slot = engine, request, slot
        # from the request's arrival (monotonic; else from its queueing): its TTFT and e2e start there
        self.started = arrived if arrived is not None else time.monotonic() - queue_s
        self.started_at = time.time() - (time.monotonic() - self.started)
        self.started_at = request.started_at if request.started_at is not None else self.started_at
        self.queue_s, self.load, self.mode_reason, self.arm = queue_s, load, mode_reason, arm
        self.prompt_ids = prompt_ids if prompt_ids is not None else engine.encode(request)
        use_draft = speculate and request.gamma > 0
        self.drafter = engine.drafter(request.drafter, slot) if use_draft else None
        self.mode = "speculative" if self.drafter else "autoregressive"  # as admitted (decided), for the record
        self.drafter_name = self.drafter.name if self.drafter else None
        self.loop = SpeculativeDecoder(
            slot.decoder,
            self.drafter,
            engine.target.device,
            engine.config.lookahead,
            engine.step_costs,
            engine.config.draft_floor,
        )
        self.text = TextStream(engine.tokenizer, request.stop, engine.tokenizer_lock)
        self.stop_ids = frozenset() if request.ignore_eos else engine.stop_ids  # the tokens that end this request
        self.ttft: float | None = None
        self.retries, self.error = 0, None
        self.choice = None  # the policy selector's pick, for a request that asked for drafter 'auto'
        # device seconds charged to this request: by the scheduler (its share of each batched forward, its
        # own steps whole), or by `timed` when it runs alone (Engine.stream)
        self.device_s = 0.0
        self.failed_device_s: float | None = None  # of device_s, the failed attempt's (a retry's record)
        self.split_rules: set[str] = set()  # how the shared forwards it was in were split (device_time.py)

    @property
    def finished(self) -> bool:
        return self.loop.finished or self.text.stopped

    @property
    def generated(self) -> list[int]:
        return self.loop.tokens[len(self.prompt_ids) :]

    def prefill(self) -> str:
        """The whole prompt in one forward, then the first token."""
        with self.engine.streams.target():
            self.loop.prefill(self.prompt_ids, *self._loop_args())
        return self._first_delta()

    def begin(self) -> str:
        """Start the request without a forward: the scheduler's rounds feed its prompt (`propose`)."""
        with self.engine.streams.target():  # the target's cache is allocated (and, on CUDA, zeroed) there
            self.loop.begin(self.prompt_ids, *self._loop_args())
        return ""

    def _loop_args(self) -> tuple:
        request = self.request
        return request.max_tokens, request.gamma, request.sampling, self.stop_ids, request.seed, request.min_tokens

    def advance(self) -> str:
        """One round: draft on the draft stream, verify on the target stream (CUDA; CPU: one thread)."""
        return self.verify(self.propose())

    # A round split in two, so the scheduler can verify several requests in one target forward.
    def propose(self, prompt_chunk: int | None = None) -> torch.Tensor:
        """The next prompt chunk (at most `prompt_chunk` tokens) while the prompt is not all fed, else a draft."""
        with self.engine.streams.draft():
            return self.loop.propose(prompt_chunk)

    def accept(self, logits: torch.Tensor, forward_s: float, shared: bool = False) -> str:
        self.loop.accept(logits, forward_s, shared)
        return self._first_delta() if self.ttft is None and self.loop.generated else self._delta()

    def _first_delta(self) -> str:
        self.ttft = time.monotonic() - self.started
        return self._delta()

    def retry_of(self, failed: Run, error: str) -> None:
        """This (plain) run retries `failed`, which raised `error`; the client only gets text it has not seen.

        The record describes the request as admitted: `mode`, `drafter` and `arm` stay those of the failed
        attempt (a request that failed speculating and was retried plainly is speculative work with
        `retries` 1 and `error` set, so cost counts it in speculation's retries, not as ok plain work);
        its draft counts and timings are the retry's. device_s adds both attempts' device time, and
        failed_device_s says how much of it the failed attempt used (cost's retries line, measured)."""
        self.started, self.started_at, self.retries, self.error = failed.started, failed.started_at, 1, error
        self.mode, self.drafter_name, self.arm = failed.mode, failed.drafter_name, failed.arm
        self.device_s, self.split_rules = failed.device_s, set(failed.split_rules)
        self.failed_device_s = failed.device_s
        self.text.sent = failed.text.sent

    def verify(self, fed: torch.Tensor) -> str:
        """The target forward for this request alone, then `accept`."""
        started = time.monotonic()
        with self.engine.streams.target():
            logits = self.slot.decoder.forward(fed, keep=self.loop.keep)
        return self.accept(logits, time.monotonic() - started)

    def timed(self, step) -> str:
        """Run one step of this request alone on the device, charging its wall time to `device_s`."""
        started = time.monotonic()
        try:
            return step()
        finally:
            self.device_s += time.monotonic() - started

    def _delta(self) -> str:
        delta = self.text.update(self.generated)
        return delta + self.text.flush() if self.finished else delta

    def result(self, status: str = "ok", error: str | None = None, first_sent: float | None = None) -> GenerateResult:
        """The answer and its record; `first_sent`: when the server sent the first chunk with text
        (monotonic), which ends the record's TTFT; without it (not streamed, or not sent yet) the TTFT
        ends when the first token was decoded."""
        if first_sent is not None:
            self.ttft = first_sent - self.started
        error = error or self.error
        generated = self.generated
        if status != "ok":
            finish = status
        else:
            finish = "stop" if self.text.stopped or (generated and generated[-1] in self.stop_ids) else "length"
            self.engine.learn(self.prompt_ids, generated)
        return GenerateResult(self.text.text, generated, finish, self._record(status, error))

    def _record(self, status: str, error: str | None) -> RequestRecord:
        stats: DecodeStats = self.loop.stats
        return RequestRecord(
            request_id=self.request.request_id or uuid.uuid4().hex,
            instance=self.engine.config.instance,
            model=self.engine.target.name,
            drafter=self.drafter_name,
            mode=self.mode,
            mode_reason=self.mode_reason,
            arm=self.arm,
            started_at=self.started_at,
            queue_s=self.queue_s,
            ttft_s=self.ttft,
            e2e_s=time.monotonic() - self.started,
            prompt_tokens=len(self.prompt_ids),
            output_tokens=len(self.generated),
            num_drafts=stats.num_drafts,
            num_draft_tokens=stats.num_draft_tokens,
            num_accepted_tokens=stats.num_accepted_tokens,
            accepted_per_position=stats.accepted_per_position,
            drafts_per_position=stats.drafts_per_position,
            gamma=stats.gamma,
            draft_s=stats.draft_s,
            verify_s=stats.verify_s,
            mean_lookahead=stats.mean_lookahead,
            # 0: driven by hand, nobody timed its steps (every charged request has a timed prefill)
            device_s=self.device_s or None,
            device_s_source=record_source(self.split_rules) if self.device_s else None,
            failed_device_s=self.failed_device_s if self.device_s and self.retries else None,
            retries=self.retries,
            status=status,
            error=error,
            load_at_admission=self.load,
            tags=dict(self.request.tags),
        )


def _stop_token_ids(target: LoadedModel) -> frozenset[int]:
    ids = {target.tokenizer.eos_token_id}
    eos = getattr(target.model.generation_config, "eos_token_id", None)
    ids.update(eos if isinstance(eos, list) else [eos])
    return frozenset(i for i in ids if i is not None)


def _parse_drafter(spec: str) -> tuple[str, str]:
    """'ngram' | 'suffix' | 'early-exit:K' | 'model:PATH' -> (kind, argument); anything else is a ValueError."""
    kind, _, arg = spec.partition(":")
    if (kind in MODEL_FREE and not arg) or (kind == "early-exit" and arg.isdecimal()) or (kind == "model" and arg):
        return kind, arg
    raise RequestError(f"unknown drafter {spec!r}: use none, ngram, suffix, model:PATH or early-exit:K", "drafter")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
