"""Cost-aware lookahead: how many tokens to draft this round.

A round that drafts k tokens feeds k + 1 tokens to one target forward and commits
E[accepted | k] + 1 tokens, where E[accepted | k] = sum_{i<k} prod_{j<=i} p_j and p_j is
the probability that draft position j is accepted given every earlier one was. The
round's cost is the verify forward of k + 1 tokens (measured: it grows with k, ~1.3-1.6x
a plain step at k = 8 on a CPU) plus k tokens of drafting (free for n-gram lookup, a
forward each for a draft model). `LookaheadModel.choose` picks the k in 0..gamma with the
most expected tokens per second; k = 0 is a plain step (yield 1). Where drafting does not
pay (open chat: low acceptance) it stops drafting, and re-probes after `probe_every` idle
rounds so the acceptance estimate stays fresh; a probe that is rejected outright doubles that
wait (up to `max_probe_every`), one that is accepted resets it. A request starts from the
drafter's recent acceptance (a `shared` estimate over the rounds of every request that used
it), not from a fixed prior, so a drafter that keeps failing is not re-tried at length by
every new request.

A drafter that sizes its own drafts from its own estimates (suffix decoding: it drafts while the
continuation's frequency in its trie stays >= min_prob) is asked for gamma tokens instead, and
`LookaheadModel.trim` keeps the prefix with the most expected tokens per second, reading its
per-token estimates scaled by how well they have matched verification so far (`Calibration`):
a confident match is verified whole even after a run of rejected guesses, which the averaged
per-position acceptance would have cut to nothing.

Pure bookkeeping: no torch, no clocks; the decoder feeds it measured seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PRIOR_SLOPE = 0.05  # relative verify cost per extra token before two lengths are measured (CPU: ~0.04-0.07)

# The engine's default `LookaheadModel.floor` (EngineConfig.draft_floor): verification is cheap at batch 1, so
# the tokens/s optimum verifies tokens the drafter itself gives a 20-30% chance; each rejected one is a verify
# row another request could have used, and a drafter whose verified tokens are mostly rejected trips the
# acceptance alert. At 0.4 the trained head keeps its speed-up at batch 1 (bench/draft_adaptation.py
# --draft-floor, docs/engine.md). A drafter that sizes its drafts stops drafting at such a token (SpecDec++'s
# stopping rule, EAGLE-2's confidence).
DEFAULT_DRAFT_FLOOR = 0.4


def check_draft_floor(floor: float) -> None:
    if not 0.0 <= floor < 1.0:
        raise ValueError(f"draft floor must be in [0, 1), got {floor}")


@dataclass
class CostCurve:
    """Seconds per target forward by (batch size, rows per request), exponentially weighted: the engine's
    step-cost curve. Rows per request = the forward's token rows / the requests in it: 1 for plain steps,
    k + 1 for a lone request drafting k, (b + k) / b for one request drafting k beside b - 1 plain ones.

    Kept per batch size, not per bucket of sizes: a forward of 5 requests is priced from forwards of 5 (or,
    until it has its own, between the measured sizes around it), never from an average over 5 to 8."""

    alpha: float = 0.2  # weight of a new measurement
    seconds: dict[int, dict[float, float]] = field(default_factory=dict)  # batch -> rows -> seconds
    counts: dict[int, dict[float, int]] = field(default_factory=dict)  # batch -> rows -> forwards observed

    def observe(self, batch: int, tokens: float, seconds: float) -> None:
        if batch < 1 or tokens < 1 or seconds < 0:
            raise ValueError(f"need batch >= 1, tokens >= 1 and seconds >= 0, got {batch}, {tokens}, {seconds}")
        curve = self.seconds.setdefault(batch, {})
        counted = self.counts.setdefault(batch, {})
        old, seen = curve.get(tokens), counted.get(tokens, 0)
        # a shape's first forward carries one-off kernel set-up (oneDNN builds its primitives: 86
        # against 54 ms for 2 rows on the AVX2 machine), and a rarely chosen length would keep that
        # stale price for long: a faster second forward replaces it
        provisional = old is None or (seen == 1 and seconds < old)
        curve[tokens] = seconds if provisional else old + self.alpha * (seconds - old)
        counted[tokens] = seen + 1

    def slope(self) -> float:
        """Relative cost per extra token (cost(n) / cost(1) = 1 + slope * (n - 1)), from the measured curves."""
        for batch in sorted(self.seconds):
            fit = _fit(self.seconds[batch])
            if fit is not None and fit[0] > 0:
                intercept, slope = fit
                return max(slope, 0.0) / max(intercept + slope, 1e-12)
        return PRIOR_SLOPE

    def measured(self, batch: int) -> bool:
        """Whether what rows cost is measured at `batch`: two lengths or more at that size, or, where the
        size has no curve of its own, at the measured sizes on both sides of it (read between them)."""
        if batch in self.seconds:
            return len(self.seconds[batch]) >= 2
        below, above = self._around(batch)
        return below is not None and above is not None

    def cost(self, batch: int, tokens: float) -> float:
        """Seconds for a forward of `batch` requests and `tokens` rows each; relative units (1 at one token)
        before any measurement.

        Along rows: linear interpolation between measured lengths, least-squares extrapolation beyond them,
        the prior slope scaled where one length is measured. Along batch sizes: the size's own curve, else
        linear between the nearest sizes on each side with two lengths or more, else the nearest size."""
        if batch in self.seconds or not self.seconds:
            return self._at(batch, tokens)
        below, above = self._around(batch)
        if below is not None and above is not None:
            low, high = self._at(below, tokens), self._at(above, tokens)
            return low + (high - low) * (batch - below) / (above - below)
        return self._at(min(self.seconds, key=lambda b: (abs(b - batch), b)), tokens)

    def _around(self, batch: int) -> tuple[int | None, int | None]:
        """(the largest size below batch, the smallest above it) among those with two lengths measured."""
        sizes = [b for b, curve in self.seconds.items() if len(curve) >= 2]
        below = max((b for b in sizes if b < batch), default=None)
        above = min((b for b in sizes if b > batch), default=None)
        return below, above

    def _at(self, batch: int, tokens: float) -> float:
        """One batch size's curve at `tokens` rows per request (relative prior when not measured)."""
        curve = self.seconds.get(batch, {})
        if not curve:
            return 1.0 + PRIOR_SLOPE * (tokens - 1)
        if tokens in curve:
            return curve[tokens]
        lengths = sorted(curve)
        if len(lengths) == 1:
            n0, c = lengths[0], self.slope()
            return curve[n0] * (1 + c * (tokens - 1)) / (1 + c * (n0 - 1))
        if lengths[0] < tokens < lengths[-1]:
            hi = next(n for n in lengths if n > tokens)
            lo = max(n for n in lengths if n < tokens)
            return curve[lo] + (curve[hi] - curve[lo]) * (tokens - lo) / (hi - lo)
        intercept, slope = _fit(curve)
        edge = lengths[0] if tokens < lengths[0] else lengths[-1]
        return max(curve[edge] + max(slope, 0.0) * (tokens - edge), 1e-12)


def _fit(curve: dict[int, float]) -> tuple[float, float] | None:
    """Least-squares line seconds = intercept + slope * tokens; None below two lengths."""
    if len(curve) < 2:
        return None
    xs, ys = list(curve), list(curve.values())
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


@dataclass
class Acceptance:
    """Per-position conditional acceptance p_i from recent rounds, with exponential decay.

    A round that drafted d and accepted a is a success at positions < a, a failure at position a
    (when a < d), and says nothing about later positions. Each estimate is shrunk towards the
    position before it (the first towards `prior`) with weight `prior_weight`."""

    gamma: int
    decay: float = 0.85  # per observed round
    prior: float = 0.6
    prior_weight: float = 1.0
    trials: list[float] = field(init=False)
    successes: list[float] = field(init=False)

    def __post_init__(self) -> None:
        self.trials, self.successes = [0.0] * self.gamma, [0.0] * self.gamma

    def observe(self, drafted: int, accepted: int) -> None:
        if not 0 <= accepted <= drafted <= self.gamma:
            raise ValueError(f"need 0 <= accepted <= drafted <= {self.gamma}, got {accepted}/{drafted}")
        if not drafted:
            return
        self.trials = [t * self.decay for t in self.trials]
        self.successes = [s * self.decay for s in self.successes]
        for i in range(min(accepted + 1, drafted)):
            self.trials[i] += 1
            self.successes[i] += i < accepted

    def probabilities(self, prior: list[float] | None = None) -> list[float]:
        """Per-position estimates; each shrunk towards `prior[i]` when given (the drafter's shared
        estimate), else towards the position before it (the first towards `self.prior`)."""
        out, before = [], self.prior
        for i, (trials, successes) in enumerate(zip(self.trials, self.successes)):
            toward = prior[i] if prior is not None and i < len(prior) else before
            before = (successes + self.prior_weight * toward) / (trials + self.prior_weight)
            out.append(before)
        return out


@dataclass
class Calibration:
    """Accepted tokens over the drafts' own expected accepted length (the sum of their prefix
    probabilities), exponentially weighted per round; 1 (trust the drafter) before evidence."""

    decay: float = 0.9
    prior_weight: float = 2.0  # expected tokens' worth of the prior factor 1
    predicted: float = 0.0
    accepted: float = 0.0

    def observe(self, predicted: float, accepted: int) -> None:
        self.predicted = self.predicted * self.decay + predicted
        self.accepted = self.accepted * self.decay + accepted

    @property
    def factor(self) -> float:
        return (self.accepted + self.prior_weight) / (self.predicted + self.prior_weight)


def expected_accepted(p: list[float], k: int) -> float:
    """E[accepted | k drafted] = sum_{i<k} prod_{j<=i} p_j."""
    total, run = 0.0, 1.0
    for pi in p[:k]:
        run *= pi
        total += run
    return total


@dataclass
class LookaheadModel:
    """Verify cost curve (may be shared by the requests of one target) + this request's acceptance."""

    gamma: int
    costs: CostCurve = field(default_factory=CostCurve)
    shared: Acceptance | None = None  # the drafter's acceptance over every request's rounds (a prior)
    probe_every: int = 8  # after this many rounds of k = 0 in a row, draft `probe` tokens once
    max_probe_every: int = 64  # a rejected probe doubles the wait up to this
    probe: int = 2
    draft_alpha: float = 0.2
    floor: float = 0.0  # `trim`: no drafted token the drafter gives less chance than this is verified
    acceptance: Acceptance = field(init=False)
    calibration: Calibration = field(default_factory=Calibration)  # of a drafter's own estimates (`trim`)
    draft_s_per_token: float = 0.0  # exponentially weighted drafting seconds per drafted token
    idle_rounds: int = 0
    probing: bool = False  # this round is a probe
    chosen: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.gamma < 0:
            raise ValueError(f"gamma must be >= 0, got {self.gamma}")
        check_draft_floor(self.floor)
        self.acceptance = Acceptance(self.gamma)
        self.wait = self.probe_every

    def observe_round(
        self, drafted: int, accepted: int, batch: int, forward_s: float, draft_s: float, predicted: float | None = None
    ) -> None:
        """One verified round: `drafted` tokens proposed (the forward saw drafted + 1), `accepted` of them kept;
        `predicted`: the drafter's own expected accepted length for them (a `trim`med draft)."""
        if forward_s > 0:  # 0: a caller that does not time its forwards (the curve keeps its prior)
            self.costs.observe(batch, drafted + 1, forward_s)
        self.acceptance.observe(drafted, accepted)
        if self.shared is not None and drafted <= self.shared.gamma:
            self.shared.observe(drafted, accepted)
        if predicted is not None and drafted:
            self.calibration.observe(predicted, accepted)
        if self.probing:
            self.probing = False
            self.wait = min(2 * self.wait, self.max_probe_every) if accepted == 0 else self.probe_every
        if drafted:
            per_token = draft_s / drafted
            old = self.draft_s_per_token
            self.draft_s_per_token = per_token if old == 0.0 else old + self.draft_alpha * (per_token - old)

    def rate(self, k: int, batch: int, p: list[float] | None = None) -> float:
        """Expected committed tokens per second when drafting k (relative units before measurements)."""
        p = self.probabilities() if p is None else p
        # drafting time is in seconds: comparable once the curve is too
        drafting = k * self.draft_s_per_token if self.costs.seconds else 0.0
        return self._per_second(expected_accepted(p, k), k, batch, drafting)

    def _per_second(self, expected: float, k: int, batch: int, drafting_s: float = 0.0) -> float:
        """Committed tokens per second of a round verifying k drafted tokens of which `expected` are
        accepted; the other requests in the batch feed one row each."""
        return (expected + 1) / max(self.costs.cost(batch, (batch + k) / batch) + drafting_s, 1e-12)

    def best(self, gamma: int, batch: int) -> int:
        """argmax over k in 0..gamma of rate(k); ties go to the shorter draft."""
        p = self.probabilities()
        return max(range(min(gamma, self.gamma) + 1), key=lambda k: (self.rate(k, batch, p), -k))

    def probabilities(self) -> list[float]:
        """This request's per-position acceptance, shrunk towards the drafter's shared estimate."""
        return self.acceptance.probabilities(self.shared.probabilities() if self.shared is not None else None)

    def choose(self, gamma: int, batch: int = 1) -> int:
        """This round's lookahead (at most `gamma`), re-probing after `wait` idle rounds; recorded."""
        return self._probe_or(self.best(gamma, batch), gamma)

    def trim(self, probs: list[float], batch: int = 1) -> int:
        """How many tokens of a drafter-sized draft to verify: the prefix with the most expected tokens
        per second, where probs[i] is the drafter's estimate that its first i + 1 tokens are all accepted
        (scaled by `calibration`), and none of whose tokens has its own chance (probs[i] / probs[i - 1])
        below `floor`; drafting is already paid. Re-probes like `choose`; recorded."""
        factor, expected = self.calibration.factor, [0.0]
        for i, p in enumerate(probs):
            if p < self.floor * (probs[i - 1] if i else 1.0):
                break
            expected.append(expected[-1] + min(1.0, factor * p))
        k = max(range(len(expected)), key=lambda k: (self._per_second(expected[k], k, batch), -k))
        return self._probe_or(k, len(probs))

    def _probe_or(self, k: int, limit: int) -> int:
        """`k`, or a probe of min(probe, limit) tokens after `wait` rounds in a row that chose 0 of `limit` > 0."""
        if k == 0 and limit > 0:
            self.idle_rounds += 1
            if self.idle_rounds >= self.wait:
                self.idle_rounds, k, self.probing = 0, min(self.probe, limit), True
        elif k > 0:
            self.idle_rounds = 0
        self.chosen.append(k)
        return k

    @property
    def mean_chosen(self) -> float | None:
        return sum(self.chosen) / len(self.chosen) if self.chosen else None
