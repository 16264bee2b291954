"""Micro-benchmark of the suffix drafter: propose() cost per round at 1k and 4k-token contexts.

Run: .venv/bin/python -m bench.suffix_propose. A context of text-like tokens (repeated phrases among
random ones), the shared cache filled with 64 finished outputs; each round commits 1-8 tokens as a
verify would, then proposes k=8. Prints the mean and p99 propose() time, the one-off prompt indexing,
the learn/evict cost of a finished request, and the trie sizes.
"""

from __future__ import annotations

import random
import statistics
import time

from specwatch.engine.sampling import SamplingParams
from specwatch.engine.suffix import SuffixCache, SuffixConfig, SuffixDrafter

_PHRASES = random.Random(0)
PHRASES = [[_PHRASES.randrange(32_000) for _ in range(_PHRASES.randint(3, 12))] for _ in range(200)]


def text_like(rng: random.Random, n: int, vocab: int = 32_000) -> list[int]:
    """Half phrases shared by every sequence (so the tries match often), half random tokens."""
    phrases = PHRASES
    out: list[int] = []
    while len(out) < n:
        out += rng.choice(phrases) if rng.random() < 0.5 else [rng.randrange(vocab) for _ in range(rng.randint(1, 6))]
    return out[:n]


def bench(context: int, rounds: int = 400) -> None:
    rng = random.Random(context)
    cache = SuffixCache(SuffixConfig())
    learn = []
    for _ in range(cache.config.max_requests + 16):  # the last 16 evict
        started = time.perf_counter()
        cache.learn(text_like(rng, 64), text_like(rng, 256))
        learn.append(time.perf_counter() - started)
    drafter, params = SuffixDrafter(cache), SamplingParams()
    tokens = text_like(rng, context)
    drafter.begin(context + 4096)
    started = time.perf_counter()
    drafter.propose(tokens, 8, params, None)
    index_s = time.perf_counter() - started
    times = []
    for _ in range(rounds):
        draft, _ = drafter.propose(tokens, 8, params, None)
        tokens += draft[: rng.randint(0, len(draft))] + [rng.randrange(32_000)]
        started = time.perf_counter()
        drafter.propose(tokens, 8, params, None)
        times.append(time.perf_counter() - started)
    times.sort()
    p99 = times[int(0.99 * len(times))]
    print(
        f"context {context:5d}: propose mean {statistics.mean(times) * 1e3:.3f} ms, p99 {p99 * 1e3:.3f} ms; "
        f"prompt indexing {index_s * 1e3:.1f} ms; learn+evict mean {statistics.mean(learn[-16:]) * 1e3:.2f} ms; "
        f"nodes: request {drafter.trie.nodes}, shared {cache.trie.nodes}"
    )


if __name__ == "__main__":
    for size in (1024, 4096):
        bench(size)
