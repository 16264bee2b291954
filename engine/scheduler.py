"""Admission queue + N decoding slots, scheduled one round at a time.

A single worker thread owns the model. Each iteration it admits queued requests
into free slots (policy decision + prefill), then advances every active request
by one speculative round, so a long generation never holds back another
request's first token. In a round each request drafts on its own, then one
target forward verifies every request's proposal together (ragged batching: the
weights are read once for all of them; see `decoder.forward_batch`; compiled, the slots' caches
share one `decoder.CachePool` and that forward is one graph), on the cores other processes leave
free (engine/threads.py). With `prefill_chunk` N a new
request's prompt is not prefilled at admission but rides in the rounds' forwards instead, at most
N tokens a round while other requests decode, so that a long prompt stalls their tokens for less
at a time (at some throughput: see the field). Text deltas and the final result are handed to the
waiting client through its asyncio loop; a client that goes away cancels its
request at the next round. Every finished request becomes one telemetry record.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specwatch.engine.decoder import forward_many
from specwatch.engine.device_time import split_forward
from specwatch.engine.engine import Delta, Engine, GenerateRequest, GenerateResult, Run
from specwatch.engine.policy import Policy
from specwatch.engine.speculative import StageError
from specwatch.engine.threads import release_openmp_workers, using
from specwatch.telemetry.schema import RequestRecord
from specwatch.telemetry.sink import TelemetrySink

log = logging.getLogger("specwatch.scheduler")


@dataclass(frozen=True)
class SchedulerConfig:
    slots: int = 4
    max_queue: int = 64
    batch: bool = True  # one target forward per round for all active requests (False: one each)
    # with batch: prompt tokens a round feeds beside decoding requests (0: each prompt whole, at admission).
    # On a 2-core Zen 4 EPYC (float32, compiled) 1,254 prompt tokens beside 7 decoding rows took 2.2-2.4 s
    # in one forward (the others' longest wait for a token), 0.5-0.7 s a chunk of 256, 2.9-3.0 s in all;
    # in a closed loop of 4 and 8 clients (bench/vs_vllm.py's prompts) chunks of 256 gave 0.95x and 0.93x
    # the tokens/s of prefill at admission, whole prompts riding in the round's forward 0.98x and 1.00x; on a
    # 2-core AMX Xeon (bf16, riding in the pool's compiled graph) whole prompts riding 0.98x and 1.04x
    prefill_chunk: int = 0

    def __post_init__(self) -> None:
        if self.slots < 1 or self.max_queue < 0 or self.prefill_chunk < 0:
            raise ValueError("slots must be >= 1, max_queue >= 0 and prefill_chunk >= 0")


class Overloaded(Exception):
    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"the engine is at capacity; retry in {retry_after_s} s")
        self.retry_after_s = retry_after_s


class ShuttingDown(RuntimeError):
    """Sent to a queued request that the shutdown's deadline cancelled before it started."""


@dataclass
class Ticket:
    """A client's handle on one request: deltas (Delta), then a GenerateResult, arrive on `events`."""

    request: GenerateRequest
    prompt_ids: list[int]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    queued_at: float = field(default_factory=time.monotonic)
    arrived: float | None = None  # monotonic, when the server got the request (its headers); else queued_at
    cancelled: threading.Event = field(default_factory=threading.Event)
    keep: Callable[[Any], None] | None = None  # the server's capture step for the finished request (or None)
    stream: bool = False  # a stream: its record is put when the server has sent it (`hold`, `release`)
    # monotonic, when the server handed the stream's first chunk with text to the transport: the record's
    # TTFT ends there, where the client's clock stops too (None: not streamed, or not yet sent)
    first_sent: float | None = None
    _held: tuple[RequestRecord, Callable[[RequestRecord], None]] | None = None
    _final: RequestRecord | None = None  # the held record as the stream's final chunk showed it
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.arrived is None:
            self.arrived = self.queued_at

    def send(self, item: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the client's event loop is closed (shutdown): nobody waits
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)

    def hold(self, record: RequestRecord, put: Callable[[RequestRecord], None]) -> bool:
        """The scheduler, at the end: True when the server puts `record` once the stream is sent (`release`),
        its TTFT ending at the first chunk with text sent and its e2e at the last, as on the client's clock."""
        with self._lock:
            if not self.stream or self.cancelled.is_set():
                return False
            self._held = (record, put)
            return True

    def sent_first(self) -> None:
        """The server, once the transport took the first chunk with text."""
        with self._lock:
            self.first_sent = time.monotonic()

    def settle(self, record: RequestRecord) -> RequestRecord:
        """The server, building the stream's final chunk: the held record with the server's times, which the
        chunk's metrics show and `release` puts (a record not held: `record` as it is)."""
        with self._lock:
            if self._held is None:
                return record
            self._final = self._timed(self._held[0])
            return self._final

    def release(self) -> None:
        """The server, when the stream ended or its client left: the held record is put (never lost)."""
        with self._lock:
            held, final, self._held = self._held, self._final, None
        if held is not None:
            record, put = held
            put(final or self._timed(record))

    def _timed(self, record: RequestRecord) -> RequestRecord:
        """TTFT to the first chunk with text sent (if one was), e2e to now."""
        ttft = record.ttft_s if self.first_sent is None else self.first_sent - self.arrived
        e2e = max(time.monotonic() - self.arrived, ttft or 0.0)
        return record.model_copy(update={"ttft_s": ttft, "e2e_s": e2e})


@dataclass
class BusyTime:
    """Seconds the model spent on target forwards and on drafting (for utilisation samples).

    The same seconds are charged to the requests (`Run.device_s`), so their sum is target_s + draft_s:
    a batched forward shared out by engine/device_time.py's rule, every other step whole to its request."""

    target_s: float = 0.0
    draft_s: float = 0.0


class Scheduler:
    def __init__(
        self, engine: Engine, config: SchedulerConfig, policy: Policy, sink: TelemetrySink | None = None
    ) -> None:
        self.engine, self.config, self.policy = engine, config, policy
        self.sink = sink or TelemetrySink(engine.config.instance)  # gets every finished request's record
        self.slots = engine.make_slots(config.slots, config.batch)
        self.busy = BusyTime()
        self._queue: deque[Ticket] = deque()
        self._active: dict[int, tuple[Ticket, Run]] = {}
        self._wake = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._work, name="specwatch-scheduler", daemon=True)
        # the forwards move to the scheduler's thread: the OpenMP workers this thread started loading and
        # compiling the model would make libgomp spin-wait too briefly at every kernel (engine/threads.py)
        release_openmp_workers()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Cancel what is still running or queued (recorded `cancelled`) at the end of the current round.

        A graceful shutdown lets the server finish in-flight requests first; this is its deadline."""
        with self._wake:
            self._stopped = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    @property
    def load(self) -> float:
        """(busy slots + queued requests) / slots: above 1 means requests wait."""
        return (len(self._active) + len(self._queue)) / self.config.slots

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def active(self) -> int:
        return len(self._active)

    def submit(
        self,
        request: GenerateRequest,
        loop: asyncio.AbstractEventLoop,
        arrived: float | None = None,
        stream: bool = False,
    ) -> Ticket:
        """Queue `request`; `arrived`: when the server got it (monotonic; default now), where its TTFT starts;
        `stream`: its TTFT ends when the server sends its first chunk with text (Ticket.sent_first)."""
        ticket = Ticket(request, self.engine.encode(request), loop, arrived=arrived, stream=stream)
        with self._wake:
            if len(self._queue) + len(self._active) >= self.config.slots + self.config.max_queue:
                raise Overloaded(retry_after_s=max(1, round(len(self._queue) / self.config.slots)))
            self._queue.append(ticket)
            self._wake.notify()
        return ticket

    def _work(self) -> None:
        while True:
            with self._wake:
                while not self._stopped and not self._queue and not self._active:
                    self._wake.wait()
                if self._stopped:
                    break
            try:
                self._admit()
                self._round()
            except Exception as exc:  # a bug must not stop the engine (every later request would hang)
                log.exception("scheduler round failed; its requests fail")
                self._fail_active(exc)
        self._cancel_all()

    def _fail_active(self, exc: Exception) -> None:
        for index in list(self._active):
            ticket, _ = self._active.pop(index)
            ticket.send(exc)

    def _cancel_all(self) -> None:
        for index in list(self._active):
            self._finish(index, "cancelled")
        with self._wake:
            queued, self._queue = list(self._queue), deque()
        for ticket in queued:  # never started: recorded cancelled, and the client gets an error
            self.sink.put(self._unrun(ticket))
            ticket.send(ShuttingDown("the engine shut down before the request started"))

    def _admit(self) -> None:
        free = [i for i in range(len(self.slots)) if i not in self._active]
        while free:
            with self._wake:
                if not self._queue:
                    return
                load = self.load
                ticket = self._queue.popleft()
            if ticket.cancelled.is_set():  # its client left while it waited: recorded, never run
                self.sink.put(self._unrun(ticket))
                continue
            index = free.pop(0)
            self._start(index, ticket, load)

    def _unrun(self, ticket: Ticket) -> RequestRecord:
        """The record of a request cancelled while it waited (its client left, or the shutdown's deadline
        came): `cancelled`, no output, its wait as its queue time, run in no mode (autoregressive, no drafter),
        so every request a client sent is stored."""
        now = time.monotonic()
        waited, since_arrival = now - ticket.queued_at, now - ticket.arrived
        request, engine = ticket.request, self.engine
        return RequestRecord(
            request_id=request.request_id or uuid.uuid4().hex,
            instance=engine.config.instance,
            model=engine.target.name,
            mode="autoregressive",
            started_at=request.started_at if request.started_at is not None else time.time() - since_arrival,
            queue_s=waited,
            e2e_s=since_arrival,
            prompt_tokens=len(ticket.prompt_ids),
            output_tokens=0,
            status="cancelled",
            tags=request.tags,
        )

    def _start(self, index: int, ticket: Ticket, load: float) -> None:
        request, choice = ticket.request, None
        if request.drafter == "auto":  # the policy's selector picks the drafter and lookahead
            choice = self.policy.choose(request.tags.get("scenario", ""))
            request = dataclasses.replace(request, drafter=choice.drafter, gamma=choice.gamma)
        decision = self.policy.decide(len(ticket.prompt_ids), load, request.drafter if request.gamma > 0 else None)
        reason = "selected" if choice is not None and decision.reason == "default" else decision.reason
        try:
            run = Run(
                self.engine,
                request,
                self.slots[index],
                speculate=decision.speculate,
                mode_reason=reason,
                arm=decision.arm,
                queue_s=time.monotonic() - ticket.queued_at,
                load=load,
                prompt_ids=ticket.prompt_ids,
                arrived=ticket.arrived,
            )
            run.choice = choice
        except Exception as exc:  # e.g. a draft model that fails to load
            log.exception("request %s could not start", request.request_id)
            ticket.send(exc)
            return
        self._active[index] = (ticket, run)
        chunked = self.config.batch and self.config.prefill_chunk
        self._step(index, run.begin if chunked else run.prefill)  # chunked: the rounds feed its prompt

    def _round(self) -> None:
        """Every active request drafts (or takes its next prompt chunk), then one target forward
        verifies all the proposals."""
        proposals = []
        together = len(self._active) if self.config.batch else 1  # requests sharing the verify forward
        budget = self._prompt_budget()
        for index in list(self._active):
            ticket, run = self._active[index]
            run.loop.batch = together  # the lookahead's cost curve is per batch size
            if ticket.cancelled.is_set():
                self._finish(index, "cancelled")
                continue
            chunk = None  # the whole prompt, or a draft
            if run.loop.prompt_left and budget is not None:
                if not budget:
                    continue  # its prompt waits for a round with room
                chunk = min(budget, run.loop.prompt_left)
                budget -= chunk
            if (fed := self._guarded(index, "draft", run.propose, chunk)) is not None:
                proposals.append((index, run, fed))
        if self.config.batch and len(proposals) > 1 and self._verify_together(proposals):
            return
        for index, run, fed in proposals:  # one at a time, so a failure stays with its own request
            self._step(index, run.verify, fed)

    def _prompt_budget(self) -> int | None:
        """Prompt tokens this round may feed: all (None) while no request decodes, else `prefill_chunk`."""
        decoding = any(not run.loop.prompt_left for _, run in self._active.values())
        return self.config.prefill_chunk if decoding and self.config.prefill_chunk else None

    def _verify_together(self, proposals: list) -> bool:
        started = time.monotonic()
        keep = [run.loop.keep for _, run, _ in proposals]
        # verifications only: --batch-threads (engine/threads.py); a prompt riding: --threads
        threads = self.engine.forward_threads(batched=not any(keep))
        try:
            with self.engine.streams.target(), using(threads):
                decoders = [run.slot.decoder for _, run, _ in proposals]
                logits = forward_many(decoders, [fed for _, _, fed in proposals], keep)
        except Exception as exc:
            log.warning("batched forward of %d requests failed (%s); verifying them one by one", len(proposals), exc)
            return False
        forward_s = time.monotonic() - started
        self.busy.target_s += forward_s
        rows = [len(fed) for _, _, fed in proposals]
        prompt = any(keep)  # a prompt chunk rode along: not a verification the cost curve prices
        shares, rule = split_forward(forward_s, rows, self.engine.step_costs, prompt)  # the curve as it stood
        for (_, run, _), share in zip(proposals, shares):  # before any accept can finish its request
            run.device_s += share
            run.split_rules.add(rule)
        if not prompt:
            self.engine.step_costs.observe(len(rows), sum(rows) / len(rows), forward_s)
        for (index, run, _), row_logits in zip(proposals, logits):
            self._step(index, run.accept, row_logits, forward_s, True)
        return True

    def _step(self, index: int, step, *args) -> None:
        """A step that commits tokens (prefill, verify): send its text, finish the request when it is done."""
        delta = self._guarded(index, "target", step, *args)
        if delta is None:
            return  # it failed: retried plainly (which delivered its own text) or finished
        ticket, run = self._active[index]
        if delta:
            ticket.send(Delta(delta, len(run.generated)))
        if run.finished:
            self._finish(index, "ok")

    def _guarded(self, index: int, busy: str, step, *args):
        """Run one step of a request, timed as target or draft work. A failure retries the
        request once in plain mode, or finishes it with the error; then the result is None."""
        run = self._active[index][1]
        started = time.monotonic()
        try:
            with using(self.engine.forward_threads()):
                result = step(*args)
        except Exception as exc:  # a failed request must not take the engine down
            self._charge(run, busy, started)
            log.warning("request %s failed: %s", run.request.request_id, exc)
            if run.drafter is not None and run.retries == 0:
                self._retry_plain(index, _error_kind(exc))
            else:
                self._finish(index, "error", _error_kind(exc))
            return None
        self._charge(run, busy, started)
        return result

    def _charge(self, run: Run, busy: str, started: float) -> None:
        """A step of one request alone: its time is busy time, and all of it is that request's."""
        elapsed = time.monotonic() - started
        run.device_s += elapsed
        if busy == "draft":
            self.busy.draft_s += elapsed
        else:
            self.busy.target_s += elapsed

    def _retry_plain(self, index: int, error: str) -> None:
        """Run the request again without a draft, recorded as the speculative request it was (Run.retry_of)."""
        ticket, failed = self._active[index]
        run = Run(
            self.engine,
            ticket.request,
            self.slots[index],
            speculate=False,
            mode_reason=failed.mode_reason,
            arm=failed.arm,
            queue_s=failed.queue_s,
            load=failed.load,
            prompt_ids=ticket.prompt_ids,
        )
        run.retry_of(failed, error)
        self._active[index] = (ticket, run)
        self._step(index, run.prefill)

    def _finish(self, index: int, status: str, error: str | None = None) -> None:
        ticket, run = self._active.pop(index)
        try:
            result: GenerateResult = run.result(status, error, ticket.first_sent)
        except Exception as exc:  # a record the telemetry contract refuses: the client still gets an answer
            log.exception("request %s: no telemetry record", run.request.request_id)
            ticket.send(exc)
            return
        self.policy.observe(result.record, run.choice)
        # a stream's record is put by the server once sent (its TTFT and e2e on the client's clock); at a
        # stop nobody may be left to send it: put now
        if self._stopped or not ticket.hold(result.record, self.sink.put):
            self.sink.put(result.record)
        ticket.send(result)


def _error_kind(exc: Exception) -> str:
    """Stage and kind for the telemetry record, e.g. 'draft:oom', 'target:runtimeerror'."""
    stage, cause = (exc.stage, exc.cause) if isinstance(exc, StageError) else ("target", exc)
    oom = isinstance(cause, MemoryError) or "out of memory" in str(cause).lower()
    return f"{stage}:{'oom' if oom else type(cause).__name__.lower()}"[:256]
