"""The speculative decoding loop: prefill, then rounds of draft -> verify -> accept.

Plain autoregressive decoding is the same loop with no draft (gamma = 0): one
target forward per token. Invariant between rounds: the target's KV cache holds
every committed token except the last one, which is fed at the start of the next
round together with the draft:

    forward([last, d1 .. dk])  ->  k + 1 rows of logits
    row i judges d(i+1); the row after the last accepted token gives the next token
    (the target's correction, or a free "bonus" token when all k were accepted)
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field

import torch

from specwatch.engine.decoder import Decoder
from specwatch.engine.drafters import Drafter
from specwatch.engine.lookahead import DEFAULT_DRAFT_FLOOR, Acceptance, CostCurve, LookaheadModel, check_draft_floor
from specwatch.engine.sampling import SamplingParams, greedy, probabilities, sample, verify_greedy, verify_stochastic


class StageError(RuntimeError):
    """A failure inside one of the two models; `stage` is 'draft' or 'target'."""

    def __init__(self, stage: str, cause: BaseException) -> None:
        super().__init__(f"{stage}: {cause}")
        self.stage, self.cause = stage, cause


@dataclass
class DecodeStats:
    """Raw counters of one request (vLLM style); ratios are derived when read:

    acceptance rate        = num_accepted_tokens / num_draft_tokens
    mean acceptance length = 1 + num_accepted_tokens / num_drafts
    output tokens          = num_accepted_tokens + target_forwards
    """

    gamma: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    drafts_per_position: list[int] = field(default_factory=list)  # drafts that proposed a token at position i
    target_forwards: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    prefill_s: float = 0.0
    lookahead_sum: int = 0  # the lookahead asked of the drafter, summed over rounds that could draft
    lookahead_rounds: int = 0

    @property
    def mean_lookahead(self) -> float | None:
        return self.lookahead_sum / self.lookahead_rounds if self.lookahead_rounds else None

    def __post_init__(self) -> None:
        self.accepted_per_position = [0] * self.gamma
        self.drafts_per_position = [0] * self.gamma

    def record_round(self, drafted: int, accepted: int) -> None:
        self.target_forwards += 1
        if drafted:
            self.num_drafts += 1
            self.num_draft_tokens += drafted
            self.num_accepted_tokens += accepted
            for position in range(accepted):
                self.accepted_per_position[position] += 1
            for position in range(drafted):
                self.drafts_per_position[position] += 1


LOOKAHEAD_MODES = ("cost", "heuristic", "fixed")
# bench/engine.py, same run: "cost" matches the heuristic within noise where drafts are accepted (n-gram,
# suffix) and keeps a losing drafter near plain speed (untrained early exit: 0.95-0.98x vs 0.86-0.89x)
DEFAULT_LOOKAHEAD = "cost"

# One verify cost curve per target decoder (a slot's): it outlives the requests that measure it.
_COST_CURVES: weakref.WeakKeyDictionary[object, CostCurve] = weakref.WeakKeyDictionary()


# One acceptance estimate per drafter (a slot's): the prior of each new request's lookahead.
MAX_SHARED_GAMMA = 16  # positions it tracks at least (a request with a longer gamma gets a longer one)
_ACCEPTANCE: weakref.WeakKeyDictionary[object, Acceptance] = weakref.WeakKeyDictionary()


def drafter_acceptance(drafter: Drafter, gamma: int) -> Acceptance:
    """The recent per-position acceptance of `drafter` over every request that used it (at least `gamma` long)."""
    found = _ACCEPTANCE.get(drafter)
    if found is None or found.gamma < gamma:
        found = _ACCEPTANCE[drafter] = Acceptance(max(gamma, MAX_SHARED_GAMMA), decay=0.98)
    return found


def cost_curve(target: Decoder) -> CostCurve:
    """The verify cost curve measured on `target`'s forwards so far (shared by its requests)."""
    curve = _COST_CURVES.get(target)
    if curve is None:
        curve = _COST_CURVES[target] = CostCurve()
    return curve


class SpeculativeDecoder:
    """Generates one request's tokens: `prefill` once, then rounds until `finished`. A round is
    `propose`, one target forward of what it returns, then `accept` of that forward's logits.

    `adaptive` sets the lookahead per round, at most gamma: 'cost' maximises expected tokens per
    second from the measured verify cost curve and recent acceptance (engine/lookahead.py),
    'heuristic' drafts 2 longer after a fully accepted draft and 1 shorter after a rejection,
    'fixed' always drafts gamma. `batch` is how many requests share the verify forward (the scheduler sets it).
    `costs`: the step-cost curve its lookahead reads and its own forwards feed (an engine's, shared by its
    slots); by default one per target decoder. `draft_floor`: under 'cost', a drafter that sizes its drafts
    has none of its tokens verified that it gives less chance than this (LookaheadModel.floor)."""

    def __init__(
        self,
        target: Decoder,
        drafter: Drafter | None,
        device: torch.device | str = "cpu",
        adaptive: str = DEFAULT_LOOKAHEAD,
        costs: CostCurve | None = None,
        draft_floor: float = DEFAULT_DRAFT_FLOOR,
    ) -> None:
        if adaptive not in LOOKAHEAD_MODES:
            raise ValueError(f"adaptive must be one of {', '.join(LOOKAHEAD_MODES)}, got {adaptive!r}")
        check_draft_floor(draft_floor)
        self.draft_floor = draft_floor
        self.target = target
        self.costs = costs if costs is not None else cost_curve(target)
        self.adaptive = adaptive
        self.batch = 1
        self.drafter = drafter
        self.device = torch.device(device)
        self.stats = DecodeStats(gamma=0)
        self.tokens: list[int] = []
        self.generated = self.prompt_fed = self._chunk = 0  # see `begin`
        self.finished = False

    def prefill(self, *request, **options) -> list[int]:
        """`begin(*request, **options)`, then the whole prompt in one forward; returns the first generated token."""
        self.begin(*request, **options)
        start = time.monotonic()
        logits = self.target.forward(self.propose(), keep=1)
        return self.accept(logits, time.monotonic() - start)

    def begin(
        self,
        prompt: list[int],
        max_new_tokens: int,
        gamma: int,
        params: SamplingParams,
        stop_ids: frozenset[int] = frozenset(),
        seed: int | None = None,
        min_new_tokens: int = 0,
    ) -> None:
        """Start a request: the first rounds then feed its prompt (`propose`, in chunks where asked),
        the round after the last chunk commits the first generated token. No stop token is chosen before
        `min_new_tokens` tokens (`_hold_stops`)."""
        if not prompt:
            raise ValueError("the prompt holds no tokens")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.gamma = gamma if self.drafter is not None else 0
        self.lookahead = self.gamma  # adapted per round, at most gamma (see _adapt_lookahead)
        shared = drafter_acceptance(self.drafter, self.gamma) if self.drafter is not None else None
        # a drafter that sizes its drafts from its own estimates: asked for the cap, trimmed (LookaheadModel.trim)
        self.trims_drafts = self.adaptive == "cost" and getattr(self.drafter, "sizes_drafts", False)
        floor = self.draft_floor if self.trims_drafts else 0.0
        self.model = LookaheadModel(self.gamma, costs=self.costs, shared=shared, floor=floor)
        self.params, self.stop_ids, self.max_new, self.min_new = params, stop_ids, max_new_tokens, min_new_tokens
        self.generator = torch.Generator(device="cpu").manual_seed(seed) if seed is not None else None
        self.stats = DecodeStats(gamma=self.gamma)
        self.tokens = list(prompt)
        self.generated = 0
        self.finished = False
        max_len = len(prompt) + max_new_tokens + self.gamma + 1
        self.target.reset(max_len)
        if self.drafter is not None:
            self.drafter.begin(max_len)
            if hasattr(self.drafter, "stop_below"):
                self.drafter.stop_below = floor
        self.prompt_fed = 0  # prompt tokens in the target's cache
        self._chunk = 0  # prompt tokens in the proposal the target is running (0: a draft's proposal)

    @property
    def prompt_left(self) -> int:
        """Prompt tokens the target has yet to see (the first token comes after the last of them)."""
        return len(self.tokens) - self.prompt_fed if not self.generated else 0

    @property
    def keep(self) -> int:
        """Rows of logits the current proposal needs: the last one for a prompt chunk, else all (0)."""
        return 1 if self._chunk else 0

    def propose(self, prompt_chunk: int | None = None) -> torch.Tensor:
        """A round's first half: the tokens the target must see. While the prompt is not all fed,
        its next `prompt_chunk` tokens (all that are left by default); then [last committed, *draft].
        The scheduler feeds several requests' proposals to one batched target forward."""
        if self.prompt_left:
            self._chunk = min(self.prompt_left, prompt_chunk or self.prompt_left)
            return torch.tensor(self.tokens[self.prompt_fed : self.prompt_fed + self._chunk], device=self.device)
        self._draft_tokens, self._draft_probs = self._draft(self._next_lookahead())
        return torch.tensor([self.tokens[-1], *self._draft_tokens], device=self.device)

    def accept(self, logits: torch.Tensor, forward_s: float, shared: bool = False) -> list[int]:
        """A round's second half: verify the draft against the target's `logits` for the proposal, commit.
        `shared`: the forward also verified other requests; its caller adds it to the cost curve, once.
        After a prompt chunk: nothing to commit until the last one, whose last row gives the first token."""
        if self._chunk:
            return self._accept_prompt(logits, forward_s)
        draft = self._draft_tokens
        start = time.monotonic()
        accepted, next_token = self._verify(self._hold_stops(logits), draft, self._draft_probs)
        self.stats.verify_s += forward_s + time.monotonic() - start
        self.target.crop(len(self.tokens) + accepted)  # drop the rejected drafts' keys and values
        if self.drafter is not None:
            self.drafter.rollback(len(self.tokens) + accepted)
            self._adapt_lookahead(len(draft), accepted)
        alone = 0.0 if shared else forward_s  # a forward of this request alone: batch 1 on the curve
        predicted = sum(self.drafter.confidence[: len(draft)]) if self.trims_drafts else None
        self.model.observe_round(len(draft), accepted, 1, alone, self._round_draft_s, predicted)
        return self._commit([*draft[:accepted], next_token], drafted=len(draft), accepted=accepted)

    def _accept_prompt(self, logits: torch.Tensor, forward_s: float) -> list[int]:
        self.prompt_fed += self._chunk
        self._chunk = 0
        self.stats.prefill_s += forward_s
        if self.prompt_left:
            return []
        start = time.monotonic()
        first = self._choose(self._hold_stops(logits[-1:])[0])
        self.stats.prefill_s += time.monotonic() - start
        return self._commit([first], drafted=0, accepted=0)

    def _hold_stops(self, logits: torch.Tensor) -> torch.Tensor:
        """The target's logits with the stop tokens at -inf in the rows (row j: output token generated + j)
        that come before `min_new` tokens (vLLM's min_tokens). Verification reads these rows, so speculation
        stays exact: it reproduces plain decoding from the same masked distribution."""
        rows = min(self.min_new - self.generated, logits.shape[0])
        if rows <= 0 or not self.stop_ids:
            return logits
        held = logits.clone()  # the forward's logits may be a view shared with other rows
        held[:rows, sorted(self.stop_ids)] = float("-inf")
        return held

    def _next_lookahead(self) -> int:
        """Tokens to ask the drafter for this round (0: a plain step); recorded in the stats."""
        cap = min(self.gamma, self.max_new - self.generated - 1)
        if self.drafter is None or cap <= 0:
            return 0
        if self.trims_drafts:
            return cap  # recorded once trimmed (`_draft`)
        k = self.model.choose(cap, self.batch) if self.adaptive == "cost" else min(self.lookahead, cap)
        self._record_lookahead(k)
        return k

    def _record_lookahead(self, k: int) -> None:
        self.stats.lookahead_sum += k
        self.stats.lookahead_rounds += 1

    def _adapt_lookahead(self, drafted: int, accepted: int) -> None:
        # A rejected draft token still costs a verify slot: draft longer after a fully
        # accepted draft, shorter after a rejection (transformers' "heuristic" schedule).
        if self.adaptive != "heuristic" or not drafted:
            return
        if accepted == drafted:
            self.lookahead = min(self.gamma, self.lookahead + 2)
        else:
            self.lookahead = max(1, self.lookahead - 1)

    def _draft(self, k: int) -> tuple[list[int], torch.Tensor | None]:
        self._round_draft_s = 0.0
        if k <= 0 or self.drafter is None:
            return [], None
        start = time.monotonic()
        try:
            draft, draft_probs = self.drafter.propose(self.tokens, k, self.params, self.generator)
        except Exception as exc:
            raise StageError("draft", exc) from exc
        self._round_draft_s = time.monotonic() - start
        self.stats.draft_s += self._round_draft_s
        if self.trims_drafts:
            # a drawn draft (sampling) was sized as it was drawn (`stop_below`): trimming it by the chances of
            # tokens drawn after a position would make keeping that position depend on its own draw (biased)
            kept = (
                len(draft)
                if draft_probs is not None
                else self.model.trim(self.drafter.confidence[: len(draft)], self.batch)
            )
            self._record_lookahead(kept)
            draft, draft_probs = draft[:kept], draft_probs[:kept] if draft_probs is not None else None
        return draft, draft_probs

    def _verify(self, logits: torch.Tensor, draft: list[int], draft_probs) -> tuple[int, int]:
        if self.params.greedy:
            return verify_greedy(logits, draft)
        return verify_stochastic(probabilities(logits, self.params), draft, draft_probs, self.generator)

    def _choose(self, logits: torch.Tensor) -> int:
        if self.params.greedy:
            return int(greedy(logits))
        return sample(probabilities(logits, self.params), self.generator)

    def _commit(self, new: list[int], drafted: int, accepted: int) -> list[int]:
        """Append this round's tokens, cut at a stop token; a stop token inside the
        accepted run becomes the round's final token, so output = accepted + forwards."""
        for i, token in enumerate(new):
            if token in self.stop_ids:
                new, accepted = new[: i + 1], min(accepted, i)
                self.finished = True
                break
        self.stats.record_round(drafted, accepted)
        self.tokens.extend(new)
        self.generated += len(new)
        if self.generated >= self.max_new:
            self.finished = True
        return new
