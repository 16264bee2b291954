"""Suffix decoding (SuffixDecoding, arXiv 2411.04975): a model-free drafter that learns across requests.

Two tries of bounded depth over token windows, with occurrence counts:
- per request: every window of prompt + generated tokens, extended as tokens are committed (O(depth) per token);
- per engine (`SuffixCache`): the outputs of the last N finished requests (plus a short tail of each prompt),
  shared by every slot; the oldest request's windows are removed when the N+1-th arrives (bounded memory).

A proposal finds the suffixes of the context that occur in a trie with a continuation, and from each
follows the most frequent next token while its empirical probability stays >= `min_prob`, drafting at
most ceil(max_spec_factor * match length) tokens; the draft with the highest expected accepted length
(sum of its prefix probabilities) wins. Drafts are one-hot proposals, verified like prompt lookup's.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

ROOT = 0
MODEL_FREE = ("ngram", "suffix")  # the drafters that hold no weights: nothing to unload, no memory pressure


@dataclass(frozen=True)
class SuffixConfig:
    max_depth: int = 24  # trie depth: match length + draft length (vLLM's suffix_decoding_max_tree_depth)
    max_requests: int = 64  # finished requests the shared trie remembers
    max_spec_factor: float = 1.0  # draft at most ceil(factor * match length) tokens
    min_prob: float = 0.1  # stop drafting when the continuation's empirical probability falls below
    prompt_tail: int = 8  # tokens of each prompt stored before its output (so an answer's start can match)
    max_stored_tokens: int = 4096  # of each finished request

    def __post_init__(self) -> None:
        if not 2 <= self.max_depth <= 64:
            raise ValueError(f"suffix max_depth must be in [2, 64], got {self.max_depth}")
        if not 0 <= self.max_requests <= 100_000:
            raise ValueError(f"suffix max_requests must be in [0, 100000], got {self.max_requests}")
        if not 0 < self.max_spec_factor <= 64:
            raise ValueError(f"suffix max_spec_factor must be in (0, 64], got {self.max_spec_factor}")
        if not 0 <= self.min_prob <= 1:
            raise ValueError(f"suffix min_prob must be in [0, 1], got {self.min_prob}")


class Draft(NamedTuple):
    tokens: list[int]
    probs: list[float]  # probs[i]: the trie's estimate that tokens[: i + 1] are all accepted
    match: int  # length of the context suffix it continues

    @property
    def score(self) -> float:
        """Expected accepted length."""
        return sum(self.probs)


class SuffixTrie:
    """All windows (length <= depth) of the sequences added, with counts; nodes live in parallel lists.

    occ[n]: occurrences of node n's string; out[n]: those followed by a token (= sum of the children's occ);
    best[n]: the child token with the highest occ (-1: none); kids[n]: {token: child node} or None.
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.occ, self.out, self.best, self.kids = [0], [0], [-1], [None]
        self._free: list[int] = []

    @property
    def nodes(self) -> int:
        return len(self.occ) - len(self._free)

    def extend(self, active: list[int], token: int) -> list[int]:
        """Add `token` after the strings of `active` (active[i]: the node of the current length-i suffix)."""
        occ, out, best, kids = self.occ, self.out, self.best, self.kids
        nxt = [ROOT]
        for node in active[: self.depth]:
            children = kids[node]
            if children is None:
                children = kids[node] = {}
            child = children.get(token)
            if child is None:
                child = children[token] = self._new()
            occ[child] += 1
            out[node] += 1
            top = best[node]
            if top != token and (top < 0 or occ[child] > occ[children[top]]):
                best[node] = token
            nxt.append(child)
        return nxt

    def add(self, tokens: list[int]) -> None:
        active = [ROOT]
        for token in tokens:
            active = self.extend(active, token)

    def remove(self, tokens: list[int]) -> None:
        """Undo `add(tokens)`: every window's counts go down; nodes no longer occurring are freed."""
        for start in range(len(tokens)):
            node = ROOT
            for token in tokens[start : start + self.depth]:
                child = self.kids[node][token]
                self.out[node] -= 1
                self.occ[child] -= 1
                if self.occ[child] == 0:
                    del self.kids[node][token]
                    self._release(child)
                if self.best[node] == token and (node != ROOT or self.occ[child] == 0):
                    self._rebest(node)  # the root's best is never drafted from: only kept valid
                if self.occ[child] == 0:
                    break  # its subtree held only this window's tail: released with it
                node = child

    def follow(self, tokens) -> int | None:
        """The node of `tokens`, or None when the trie does not hold them."""
        node = ROOT
        for token in tokens:
            children = self.kids[node]
            node = children.get(token) if children else None
            if node is None:
                return None
        return node

    def draft(self, node: int, limit: int, min_prob: float) -> tuple[list[int], list[float]]:
        """Follow the most frequent continuation from `node` while its probability >= min_prob;
        returns the draft and each prefix's probability (their sum: its expected accepted length)."""
        draft: list[int] = []
        probs: list[float] = []
        prob = 1.0
        while len(draft) < limit and self.out[node] > 0:
            token = self.best[node]
            child = self.kids[node][token]
            prob *= self.occ[child] / self.out[node]
            if prob < min_prob:
                break
            draft.append(token)
            probs.append(prob)
            node = child
        return draft, probs

    def _new(self) -> int:
        if self._free:
            return self._free.pop()
        self.occ.append(0)
        self.out.append(0)
        self.best.append(-1)
        self.kids.append(None)
        return len(self.occ) - 1

    def _release(self, node: int) -> None:
        stack = [node]
        while stack:  # a released node's descendants have no occurrences left either
            n = stack.pop()
            if self.kids[n]:
                stack.extend(self.kids[n].values())
            self.occ[n] = self.out[n] = 0
            self.best[n], self.kids[n] = -1, None
            self._free.append(n)

    def _rebest(self, node: int) -> None:
        children = self.kids[node]
        self.best[node] = max(children, key=lambda t: self.occ[children[t]]) if children else -1


class SuffixCache:
    """The shared trie over the last `max_requests` finished requests' outputs; thread-safe (one lock)."""

    def __init__(self, config: SuffixConfig = SuffixConfig()) -> None:
        self.config = config
        self.trie = SuffixTrie(config.max_depth)
        self._stored: deque[list[int]] = deque()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._stored)

    def learn(self, prompt: list[int], output: list[int]) -> None:
        """A request finished: remember its output (and its prompt's last tokens), forget the oldest beyond N."""
        if not output or self.config.max_requests == 0:
            return
        tail = prompt[-self.config.prompt_tail :] if self.config.prompt_tail else []
        sequence = (tail + list(output))[: self.config.max_stored_tokens]
        with self._lock:
            self.trie.add(sequence)
            self._stored.append(sequence)
            while len(self._stored) > self.config.max_requests:
                self.trie.remove(self._stored.popleft())

    def best_draft(self, context: list[int], k: int) -> Draft:
        with self._lock:
            return best_draft(self.trie, _matches(self.trie, context), k, self.config)


def _matches(trie: SuffixTrie, context: list[int]) -> list[int]:
    """[ROOT, node of the last token, node of the last 2 tokens, ...] while the trie holds them."""
    nodes = [ROOT]
    for length in range(1, min(len(context), trie.depth - 1) + 1):
        node = trie.follow(context[-length:])
        if node is None:
            break  # a longer suffix contains this one: the trie cannot hold it either
        nodes.append(node)
    return nodes


def best_draft(trie: SuffixTrie, nodes: list[int], k: int, config: SuffixConfig) -> Draft:
    """The best draft from the matched suffixes `nodes` (nodes[i]: length i): the highest expected
    accepted length, the longer match on a tie (arctic-inference's choice)."""
    best = Draft([], [], 0)
    for length in range(len(nodes) - 1, 0, -1):
        node = nodes[length]
        if trie.out[node] == 0:
            continue
        cap = min(k, math.ceil(config.max_spec_factor * length))
        if cap <= best.score:
            break  # a shorter match drafts at most `cap` tokens: it cannot score higher
        draft = Draft(*trie.draft(node, min(cap, trie.depth - length), config.min_prob), length)
        if draft.score > best.score:
            best = draft
    return best


class SuffixDrafter:
    """Suffix decoding for one slot: a trie of this request's tokens, and the engine's shared `SuffixCache`."""

    name = "suffix"
    sizes_drafts = True  # each draft's length follows its own estimates (`confidence`): see LookaheadModel.trim

    def __init__(self, cache: SuffixCache | None = None, config: SuffixConfig | None = None) -> None:
        self.config = config or (cache.config if cache else SuffixConfig())
        self.cache = cache
        self.begin(0)

    def begin(self, max_len: int) -> None:
        self.trie = SuffixTrie(self.config.max_depth)
        self._active = [ROOT]  # nodes of the context's suffixes, lengths 0 .. depth
        self.confidence: list[float] = []  # the last draft's prefix probabilities (Draft.probs)
        self._indexed = 0

    def propose(self, tokens, k, params, generator):
        if len(tokens) < self._indexed:  # a new request that skipped begin(): start over
            self.begin(0)
        for token in tokens[self._indexed :]:
            self._active = self.trie.extend(self._active, token)
        self._indexed = len(tokens)
        local = best_draft(self.trie, self._active, k, self.config)
        shared = self.cache.best_draft(tokens, k) if self.cache is not None and len(self.cache) else None
        draft = shared if shared is not None and shared.score > local.score else local
        self.confidence = draft.probs
        return draft.tokens, None

    def rollback(self, committed: int) -> None:
        pass  # the trie only ever holds committed tokens: nothing to undo
