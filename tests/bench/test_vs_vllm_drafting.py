"""bench/vs_vllm.py's same-text drafting check: a drafter replayed over a fixed output counts the target
forwards a greedy run would take (the prompt's forward, then one per draft, each committing its accepted
prefix plus one token)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.vs_vllm import replayed_tokens_per_step
from specwatch.engine.drafters import NgramConfig, NgramDrafter
from specwatch.engine.suffix import SuffixConfig, SuffixDrafter


class Scripted:
    """Proposes the next `right` tokens of the text, then `wrong` tokens that are not in it."""

    def __init__(self, text: list[int], right: int, wrong: int) -> None:
        self.text, self.right, self.wrong = text, right, wrong
        self.contexts: list[int] = []
        self.rollbacks: list[int] = []

    def begin(self, max_len: int) -> None:
        self.contexts, self.rollbacks = [], []

    def propose(self, tokens, k, params, generator):
        self.contexts.append(len(tokens))
        at = len(tokens)
        return (self.text[at : at + self.right] + [-1] * self.wrong)[:k], None

    def rollback(self, committed: int) -> None:
        self.rollbacks.append(committed)


def test_each_forward_commits_the_accepted_prefix_plus_one():
    prompt, output = [7, 8, 9], list(range(100, 111))  # 11 output tokens
    drafter = Scripted(prompt + output, right=2, wrong=3)
    # forward 1: the prompt, token 0; then 3 a forward (2 accepted + 1): 1 -> 4 -> 7 -> 10 -> 13 (past the end)
    assert replayed_tokens_per_step(drafter, prompt, output, gamma=8) == 11 / 5
    assert drafter.contexts == [4, 7, 10, 13]  # prompt + the committed tokens, never a rejected one
    assert drafter.rollbacks == [6, 9, 12, 14]  # the context + the accepted draft (the last capped by the text)


def test_gamma_caps_the_draft_and_a_silent_drafter_makes_one_token_a_forward():
    prompt, output = [1], list(range(50, 70))
    assert replayed_tokens_per_step(Scripted(prompt + output, right=8, wrong=0), prompt, output, gamma=3) == 20 / 6
    assert replayed_tokens_per_step(Scripted(prompt + output, right=0, wrong=0), prompt, output, gamma=8) == 1.0
    assert replayed_tokens_per_step(Scripted(prompt, right=0, wrong=0), prompt, [], gamma=8) is None


def test_real_drafters_copy_a_repeated_passage():
    passage = list(range(200, 230))
    prompt, output = passage + [5, 6], passage[:20]  # the answer quotes the prompt's first 20 tokens
    # n-gram: the prompt's forward gives 200; (6, 200) is nowhere, so a plain forward gives 201; (200, 201) then
    # matches the passage: 8 drafted and accepted + 1 (done: 11), again (done: 20). Four forwards.
    assert replayed_tokens_per_step(NgramDrafter(NgramConfig()), prompt, output, gamma=8) == 20 / 4
    suffix = replayed_tokens_per_step(SuffixDrafter(None, SuffixConfig(max_requests=0)), prompt, output, gamma=8)
    # suffix: drafts are capped by the match's length (spec factor 1): 200 | 201 (+1) | 203-205 (+1) | 207-213 (+1)
    # | 215-219 of 8 drafted, then the text ends. Five forwards.
    assert suffix == 20 / 5


def test_a_negative_prefill_chunk_is_refused_before_anything_starts():
    bench = Path(__file__).resolve().parents[2] / "bench" / "vs_vllm.py"
    argv = [sys.executable, str(bench), "--prefill-chunk", "-1"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "--prefill-chunk must be >= 0" in run.stderr and "Traceback" not in run.stderr
