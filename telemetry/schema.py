"""The telemetry contract shared by every specwatch package.

Raw counts travel; ratios are derived when read (as vLLM does):

    acceptance rate          = num_accepted_tokens / num_draft_tokens
    mean acceptance length   = 1 + num_accepted_tokens / num_drafts

This module imports nothing heavier than pydantic so any producer can use it.
"""

from __future__ import annotations

import math
from operator import ge
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from specwatch.telemetry import ratios

# 2000-01-01 .. 2100-01-01: anything outside is a unit error (ms, ns) or garbage.
MIN_EPOCH_S = 946_684_800.0
MAX_EPOCH_S = 4_102_444_800.0
MAX_GAMMA = 64
MAX_TAGS = 16
MAX_BATCH_RECORDS = 100_000  # of each kind in one batch
# The tag naming the gateway that proxied a request (its --name): the cost model shares an upstream's
# time among all gateways' requests in flight there (cost.sharing).
GATEWAY_TAG = "gateway"
# An event's free-form `detail`: at most this deep (objects and lists) and this large (its repr).
MAX_DETAIL_DEPTH = 16
MAX_DETAIL_CHARS = 4096
# Latency histogram bounds (seconds, Prometheus `le`) of TTFT and e2e latency: the engine's and the
# collector's /metrics and the collector's rollups all use these. 0.3 is the default TTFTP99High
# threshold, so its PromQL histogram_quantile needs no interpolation across it.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.25, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 25.0, 30.0, 60.0, 120.0)

# No NUL characters: PostgreSQL text cannot hold them, so they would fail at insert time.
NO_NUL = r"^[^\x00]*$"
MAX_NAME_CHARS = 128  # ids and names; the store's columns hold this many (a tenant's scoped id too)
Name = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME_CHARS, pattern=NO_NUL)]
ShortText = Annotated[str, StringConstraints(max_length=256, pattern=NO_NUL)]
TagKey = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=NO_NUL)]
TagValue = Annotated[str, StringConstraints(max_length=128, pattern=NO_NUL)]
Epoch = Annotated[float, Field(ge=MIN_EPOCH_S, le=MAX_EPOCH_S, allow_inf_nan=False)]
Seconds = Annotated[float, Field(ge=0.0, le=86_400.0, allow_inf_nan=False)]
# Realistic caps on counts, so that no sum of them overflows int64 (SQL SUM, rollups, sketches,
# Prometheus): tokens per request at most the largest context a model has (10M, Llama 4 Scout) rounded
# up; drafted tokens at most MAX_GAMMA per output token; bytes at most 1 PiB; queue lengths 1M. Summing
# int64's 9.2e18 then takes over 8e9 requests at the cap in one aggregate (docs/collector.md).
MAX_TOKENS = 2**24
MAX_DRAFT_TOKENS = MAX_GAMMA * MAX_TOKENS
MAX_BYTES = 2**50
MAX_QUEUE = 1_000_000
Tokens = Annotated[int, Field(ge=0, le=MAX_TOKENS)]
DraftTokens = Annotated[int, Field(ge=0, le=MAX_DRAFT_TOKENS)]
Bytes = Annotated[int, Field(ge=0, le=MAX_BYTES)]
Count = Annotated[int, Field(ge=0, le=MAX_QUEUE)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]

Mode = Literal["speculative", "autoregressive"]
ModeReason = Literal[
    "default", "canary", "load", "long_prompt", "low_acceptance", "alert", "memory", "manual", "selected", "failover"
]
Arm = Literal["spec", "control"]
Status = Literal["ok", "error", "cancelled"]
EnergySource = Literal["nvml", "rapl", "estimate"]
# engine: the scheduler's measured forward and draft time, each batched forward split by token rows;
# engine_step_curve: the same, each batched forward split by the engine's step-cost curve (engine/device_time.py);
# processor_sharing: a gateway's estimate, each request in flight at an upstream getting 1/n of the time.
DeviceSource = Literal["engine", "engine_step_curve", "processor_sharing"]
EventKind = Literal[
    "cold_start",
    "mode_switch",
    "defrag",
    "draft_unloaded",
    "draft_loaded",
    "oom",
    "config",
    "streams",
    "upstream",
    "canary_verdict",  # specwatch tune canary's decision (alerts.canary makes it an alert-history entry + webhook)
    "step_costs",  # the engine's step-cost curve: detail.points [[batch, rows, s, count]] (engine/step_cost_events)
]
# Ours (ngram, suffix, model:NAME, early-exit:K) and vLLM's speculative methods, as a gateway labels its upstreams.
VLLM_METHODS = ("ngram", "suffix", "eagle", "eagle3", "mtp", "medusa")
DRAFTER_PATTERN = r"^(" + "|".join(VLLM_METHODS) + r"|(?:model|draft_model):[^\s\x00]{1,200}|early-exit:[0-9]{1,4})$"


class FieldError(ValueError):
    """A cross-field check failed; `field` is the one to blame in error reports."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class _Strict(BaseModel):
    """Lax for the producers' own Python values (a numpy count, a tuple); what arrives on the wire is
    validated with `validate_wire` (strict: `"20"` or `true` is no count, `"yes"` no boolean)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class RequestRecord(_Strict):
    """One finished request; `request_id` is the idempotency key."""

    request_id: Name
    instance: Name
    model: Name
    drafter: Annotated[str, StringConstraints(pattern=DRAFTER_PATTERN)] | None = None
    mode: Mode
    mode_reason: ModeReason = "default"
    arm: Arm | None = None
    started_at: Epoch
    queue_s: Seconds = 0.0
    ttft_s: Seconds | None = None
    e2e_s: Seconds
    prompt_tokens: Tokens
    output_tokens: Tokens
    num_drafts: Tokens = 0
    num_draft_tokens: DraftTokens = 0
    num_accepted_tokens: Tokens = 0
    accepted_per_position: list[Tokens] = Field(default_factory=list, max_length=MAX_GAMMA)
    gamma: Annotated[int, Field(ge=0, le=MAX_GAMMA)] = 0
    # Drafts that proposed a token at position i (the denominators of per-position acceptance), when the
    # producer saw each draft's length (vLLM's `detailed` per_step_drafted; the engine's own drafts);
    # empty: not reported, and every draft is taken to reach gamma.
    drafts_per_position: list[Tokens] = Field(default_factory=list, max_length=MAX_GAMMA)
    draft_s: Seconds = 0.0
    verify_s: Seconds = 0.0
    retries: Annotated[int, Field(ge=0, le=1000)] = 0
    status: Status = "ok"
    error: ShortText | None = None
    energy_j: NonNegative | None = None
    energy_source: EnergySource | None = None
    load_at_admission: Annotated[float, Field(ge=0.0, le=1000.0, allow_inf_nan=False)] | None = None
    tags: dict[TagKey, TagValue] = Field(default_factory=dict, max_length=MAX_TAGS)
    # False: the producer could not see this request's draft counts (a vLLM response without per-request
    # metrics); its counts are 0 and acceptance queries skip it, its timings and tokens still count.
    draft_counts_known: bool = True
    # The mean lookahead the engine asked of its drafter per round (its cost-aware choice, at most gamma);
    # None: not chosen per round (plain decoding, or a producer that does not report it).
    mean_lookahead: Annotated[float, Field(ge=0.0, le=MAX_GAMMA, allow_inf_nan=False)] | None = None
    # The device seconds this request used (its share of the forwards it was in, and its draft steps), so
    # that the device-s of all requests add up to the device's busy time; None: the producer cannot tell.
    device_s: Seconds | None = None
    device_s_source: DeviceSource | None = None
    # Of device_s, the seconds the failed attempts of a retried request used (the engine measures them: a
    # speculative attempt that failed before the plain retry); None: not measured (cost then assumes each
    # attempt cost the same, k/(k+1) of device_s).
    failed_device_s: Seconds | None = None

    # One after-validator for all cross-field checks (one Python call per record keeps the
    # ingest hot path fast); FieldError tells the ingest service which field to name.
    @model_validator(mode="after")
    def _consistent_counts(self) -> RequestRecord:
        drafts, drafted, accepted = self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens
        per_position = self.accepted_per_position
        if drafts > drafted:
            raise FieldError(
                "num_draft_tokens", "num_drafts must be <= num_draft_tokens (a draft holds at least one token)"
            )
        if accepted > drafted:
            raise FieldError("num_accepted_tokens", "num_accepted_tokens must be <= num_draft_tokens")
        if len(per_position) != self.gamma:
            raise FieldError("gamma", f"accepted_per_position has {len(per_position)} entries, gamma is {self.gamma}")
        # One cheap test on the hot path; the slow one below says what is wrong.
        if per_position and (
            per_position[0] > drafts
            or sum(per_position) != accepted
            or not all(map(ge, per_position, per_position[1:]))
        ):
            _explain_per_position(per_position, drafts, accepted)
        if self.drafts_per_position:
            _check_drafts_per_position(self.drafts_per_position, per_position, drafts, drafted)
        if not self.draft_counts_known and (drafted or drafts or per_position):
            raise FieldError("draft_counts_known", "draft counts must be 0 when draft_counts_known is false")
        if (self.energy_j is None) != (self.energy_source is None):
            raise FieldError("energy_source", "energy_j and energy_source must be given together")
        if (self.device_s is None) != (self.device_s_source is None):
            missing = "device_s" if self.device_s is None else "device_s_source"
            raise FieldError(missing, "device_s and device_s_source must be given together")
        if self.failed_device_s is not None:
            _check_failed_device_s(self.failed_device_s, self.device_s, self.retries)
        return self

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted tokens (vLLM's definition); None when nothing was drafted."""
        return ratios.acceptance_rate(self.num_accepted_tokens, self.num_draft_tokens)

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + accepted / drafts: tokens emitted per target forward pass while drafting."""
        return ratios.mean_acceptance_length(self.num_accepted_tokens, self.num_drafts)


def _check_failed_device_s(failed: float, device_s: float | None, retries: int) -> None:
    if not retries:
        raise FieldError("failed_device_s", "failed_device_s needs retries >= 1 (the attempts it measures)")
    if device_s is None or failed > device_s * (1 + 1e-9):
        raise FieldError("failed_device_s", "failed_device_s must be <= device_s (it is part of it)")


def _explain_per_position(per_position: list[int], num_drafts: int, num_accepted: int) -> None:
    """Position i counts drafts whose tokens 0..i were all accepted: raise what is violated."""
    field = "accepted_per_position"
    if any(later > earlier for earlier, later in zip(per_position, per_position[1:])):
        raise FieldError(field, "accepted_per_position must be non-increasing")
    if per_position[0] > num_drafts:
        raise FieldError(field, "accepted_per_position[0] must be <= num_drafts")
    if sum(per_position) != num_accepted:
        raise FieldError(field, "accepted_per_position must sum to num_accepted_tokens")


def _check_drafts_per_position(reached: list[int], accepted: list[int], num_drafts: int, num_drafted: int) -> None:
    """Position i counts drafts that proposed a token there: raise what is violated."""
    field = "drafts_per_position"
    if len(reached) != len(accepted):
        raise FieldError(field, f"drafts_per_position has {len(reached)} entries, gamma is {len(accepted)}")
    if any(later > earlier for earlier, later in zip(reached, reached[1:])):
        raise FieldError(field, "drafts_per_position must be non-increasing")
    if reached[0] > num_drafts:
        raise FieldError(field, "drafts_per_position[0] must be <= num_drafts")
    if sum(reached) != num_drafted:
        raise FieldError(field, "drafts_per_position must sum to num_draft_tokens")
    if any(a > r for a, r in zip(accepted, reached)):
        raise FieldError(field, "accepted_per_position[i] must be <= drafts_per_position[i]")


class DeviceSample(_Strict):
    """A periodic reading of one instance's device and scheduler state."""

    instance: Name
    at: Epoch
    device: Name
    mem_allocated_bytes: Bytes
    mem_reserved_bytes: Bytes
    fragmentation: Annotated[float, Field(ge=0.0, le=1e6, allow_inf_nan=False)] | None = None
    power_w: Annotated[float, Field(ge=0.0, le=1e5, allow_inf_nan=False)] | None = None
    power_source: EnergySource | None = None
    util_target: Fraction | None = None
    util_draft: Fraction | None = None
    active_requests: Count = 0
    queue_depth: Count = 0
    load: Annotated[float, Field(ge=0.0, le=1000.0, allow_inf_nan=False)] | None = None
    draft_loaded: bool | None = None
    default_mode: Mode | None = None

    @model_validator(mode="after")
    def _power_has_source(self) -> DeviceSample:
        if (self.power_w is None) != (self.power_source is None):
            raise FieldError("power_source", "power_w and power_source must be given together")
        return self


class EngineEvent(_Strict):
    """Something the engine did or suffered (mode switch, defrag, OOM, ...)."""

    instance: Name
    at: Epoch
    kind: EventKind
    detail: dict[str, Any] = Field(default_factory=dict)
    duration_s: Seconds | None = None

    @field_validator("detail")
    @classmethod
    def _small_finite_detail(cls, detail: dict[str, Any]) -> dict[str, Any]:
        _check_detail(detail, 1)  # first: a deep value would overflow repr's recursion (a 500, issue 30 #3)
        if len(repr(detail)) > MAX_DETAIL_CHARS:
            raise ValueError("detail is larger than 4 KiB")
        return detail


def _check_detail(value: Any, depth: int) -> None:
    """No non-finite numbers, at most MAX_DETAIL_DEPTH levels of objects and lists (checked before
    descending, so a hostile depth costs MAX_DETAIL_DEPTH frames)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("detail holds a non-finite number")
    if not isinstance(value, (dict, list)):
        return
    if depth > MAX_DETAIL_DEPTH:
        raise ValueError(f"detail is nested deeper than {MAX_DETAIL_DEPTH} levels")
    for item in value.values() if isinstance(value, dict) else value:
        _check_detail(item, depth + 1)


class IngestBatch(_Strict):
    """One batch on the wire: {"requests": [...], "samples": [...], "events": [...]}."""

    @classmethod
    def validate_wire(cls, payload: Any) -> IngestBatch:
        """A batch parsed from JSON, in strict mode: every type exactly as the contract says (an int
        counts as a float, nothing else converts). ValidationError otherwise."""
        return cls.model_validate(payload, strict=True)

    requests: list[RequestRecord] = Field(default_factory=list, max_length=MAX_BATCH_RECORDS)
    samples: list[DeviceSample] = Field(default_factory=list, max_length=MAX_BATCH_RECORDS)
    events: list[EngineEvent] = Field(default_factory=list, max_length=MAX_BATCH_RECORDS)
