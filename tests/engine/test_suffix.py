"""The suffix drafter (engine/suffix.py): its trie, the shared cache of finished outputs, and the engine wiring."""

from __future__ import annotations

import pytest
from engine_harness import BackgroundServer

from specwatch.engine.engine import GenerateRequest, RequestError
from specwatch.engine.policy import PolicyConfig
from specwatch.engine.sampling import SamplingParams
from specwatch.engine.scheduler import SchedulerConfig
from specwatch.engine.server import request_drafter
from specwatch.engine.suffix import SuffixCache, SuffixConfig, SuffixDrafter, SuffixTrie

GREEDY = SamplingParams()


def propose(drafter: SuffixDrafter, tokens: list[int], k: int = 8) -> list[int]:
    draft, probs = drafter.propose(tokens, k, GREEDY, None)
    assert probs is None  # one-hot proposals
    return draft


def test_trie_counts_every_window_and_its_continuations():
    trie = SuffixTrie(depth=3)
    trie.add([1, 2, 1, 2, 3])
    one, one_two = trie.follow([1]), trie.follow([1, 2])
    assert trie.occ[one] == 2 and trie.out[one] == 2  # '1' twice, followed by '2' both times
    assert trie.occ[one_two] == 2 and trie.best[one_two] in (1, 3)
    assert trie.occ[trie.follow([2])] == 2 and trie.out[trie.follow([2])] == 2
    assert trie.follow([1, 2, 1, 2]) is None  # deeper than the trie
    assert trie.follow([3, 1]) is None


def test_trie_best_child_is_the_most_frequent():
    trie = SuffixTrie(depth=4)
    trie.add([7, 1, 7, 2, 7, 2, 7])
    seven = trie.follow([7])
    assert trie.best[seven] == 2
    draft, probs = trie.draft(seven, 3, min_prob=0.0)
    assert draft == [2, 7, 2]  # '7' -> 2 (2 of 3), '7 2' -> 7 (2 of 2), '7 2 7' -> 2 (its one continuation)
    assert probs == pytest.approx([2 / 3] * 3)  # each prefix's probability: the product of the steps


def test_probability_floor_stops_the_draft():
    trie = SuffixTrie(depth=8)
    trie.add([5, 1, 5, 2, 5, 3, 5, 4])  # after '5': four different tokens, 1/4 each
    assert trie.draft(trie.follow([5]), 4, min_prob=0.3) == ([], [])
    assert len(trie.draft(trie.follow([5]), 4, min_prob=0.2)[0]) == 4  # then each step is certain: stays 1/4
    trie = SuffixTrie(depth=8)
    trie.add([9, 5, 1, 9, 5, 2, 9, 5, 1])  # '9' -> 5 always, '9 5' -> 1 twice of 3
    assert trie.draft(trie.follow([9]), 4, min_prob=0.7)[0] == [5]  # the product falls to 2/3 at the 2nd
    assert trie.draft(trie.follow([9]), 4, min_prob=0.5)[0] == [5, 1, 9, 5]


def test_remove_restores_the_trie_and_frees_nodes():
    trie = SuffixTrie(depth=5)
    trie.add([1, 2, 3, 4])
    nodes = trie.nodes
    trie.add([1, 2, 9, 9, 9])
    trie.remove([1, 2, 9, 9, 9])
    assert trie.nodes == nodes
    assert trie.follow([2, 9]) is None and trie.follow([9]) is None
    two = trie.follow([1, 2])
    assert trie.occ[two] == 1 and trie.best[two] == 3  # the best child is recomputed after removal


def test_drafter_follows_the_longest_earlier_match_in_the_request():
    drafter = SuffixDrafter()
    drafter.begin(100)
    # '3 4' was followed by '9' and by '5'; the longer context '1 3 4' only by '9'
    assert propose(drafter, [1, 3, 4, 9, 9, 9, 8, 3, 4, 5, 6, 1, 3, 4], k=3) == [9, 9, 9]
    # a 4-token match ('1 3 4 9') drafts at most 4 tokens (max_spec_factor 1.0)
    assert propose(drafter, [1, 3, 4, 9, 9, 9, 8, 3, 4, 5, 6, 1, 3, 4, 9], k=8) == [9, 9, 8, 3]


def test_a_shorter_match_with_a_surer_draft_wins():
    """The longest match's draft is not the best when its continuation is uncertain: a shorter
    match that nearly always continued the same way scores higher, although its draft is shorter
    (the search stops only once no shorter match can draft more than the best score)."""
    long, run = [1, 2, 3, 4, 5, 6], [50, 51, 52, 53, 54]
    # after '1 .. 6': 7 + a fixed run twice, and three other tokens: 6 tokens at 2/5 each (score 2.4)
    history = [*long, 7, *run, 100, *long, 7, *run, 101, *long, 8, 102, *long, 10, 103, *long, 11, 104]
    # after '4 5 6' alone (as '0 4 5 6'): 9 9 9, forty times: 3 tokens at 40/45 each (score 2.67)
    history += [0, 4, 5, 6, 9, 9, 9, 105] * 40
    drafter = SuffixDrafter(config=SuffixConfig(min_prob=0.3))
    assert propose(drafter, [*history, *long], k=8) == [9, 9, 9]
    assert drafter.confidence == pytest.approx([40 / 45] * 3)


def test_draft_length_grows_with_the_match_length():
    config = SuffixConfig(max_spec_factor=1.0)
    drafter = SuffixDrafter(config=config)
    drafter.begin(100)
    text = list(range(10, 30))
    assert propose(drafter, [*text, 10], k=8) == [11]  # a 1-token match drafts ceil(1.0 * 1) = 1 token
    drafter.begin(100)
    assert propose(drafter, [*text, 10, 11, 12], k=8) == [13, 14, 15]


def test_shared_cache_drafts_an_earlier_requests_answer():
    cache = SuffixCache(SuffixConfig(prompt_tail=2))
    cache.learn([50, 51, 52], [60, 61, 62, 63, 64, 65])
    drafter = SuffixDrafter(cache)
    drafter.begin(100)
    assert propose(drafter, [1, 2, 51, 52], k=8) == [60, 61]  # matched '51 52' (the stored prompt tail)
    assert propose(drafter, [1, 2, 51, 52, 60, 61, 62], k=8) == [63, 64, 65]
    assert propose(SuffixDrafter(), [1, 2, 51, 52], k=8) == []  # without the cache: nothing to draft


def test_shared_cache_keeps_only_the_last_n_requests():
    cache = SuffixCache(SuffixConfig(max_requests=3, prompt_tail=0))
    for request in range(4):  # the 4th evicts the 1st
        cache.learn([], [100 + request, 1, 2, 3])
    assert len(cache) == 3
    assert cache.trie.follow([100]) is None and cache.trie.follow([101, 1]) is not None
    assert cache.trie.occ[cache.trie.follow([1, 2, 3])] == 3
    size = cache.trie.nodes
    for request in range(4, 40):
        cache.learn([], [100 + request, 1, 2, 3])
    assert len(cache) == 3 and cache.trie.nodes == size  # bounded: as many nodes as 3 such requests


def test_config_is_checked():
    with pytest.raises(ValueError, match="max_depth"):
        SuffixConfig(max_depth=1)
    with pytest.raises(ValueError, match="min_prob"):
        SuffixConfig(min_prob=1.5)


def test_suffix_is_a_builtin_drafter_of_the_engine_and_server(bundled_engine):
    bundled_engine.check_drafter("suffix")
    assert request_drafter("suffix", {}) == "suffix"
    with pytest.raises(RequestError, match="suffix"):
        bundled_engine.check_drafter("suffix:3")


def test_second_identical_request_drafts_from_the_first_ones_output(drafting_engine):
    """The answer is not in the prompt: the first request can only draft from its own repeats, the second
    drafts the first's output from the shared cache; both produce the same greedy tokens. Lookahead
    'fixed' (`drafting_engine`): under 'cost' how much the second request drafts depends on the step-cost
    curve earlier tests measured on this CPU (one run drafted 9 tokens in all and the ratio below hung on
    one of them)."""
    request = GenerateRequest(
        messages=[{"role": "user", "content": "Write two sentences about a lighthouse keeper named Ilse."}],
        max_tokens=48,
        drafter="suffix",
        gamma=8,
    )
    first = drafting_engine.generate(request)
    drafter = drafting_engine.drafter("suffix")
    drafter.begin(0)
    context = [*drafting_engine.encode(request), first.token_ids[0]]
    # right after the first token, the shared cache drafts the first request's answer (k as asked)
    assert propose(drafter, context, k=8) == first.token_ids[1:9]
    second = drafting_engine.generate(request)
    assert second.token_ids == first.token_ids
    assert first.record.drafter == second.record.drafter == "suffix"
    # how much of it is drafted depends on the lookahead the loop asks for; more than the first, always
    assert second.record.num_accepted_tokens > first.record.num_accepted_tokens
    # nearly every drafted token was right (the last draft may run past where the first answer ended)
    assert second.record.num_accepted_tokens >= 0.9 * second.record.num_draft_tokens


def test_server_default_drafter_suffix_serves_and_records_it(bundled_engine):
    """`engine serve --default-drafter suffix`: a request naming no drafter runs with `suffix`, in telemetry too;
    both slots share one cache of finished outputs."""
    with BackgroundServer(
        bundled_engine, SchedulerConfig(slots=2, max_queue=4), PolicyConfig(), default_drafter="suffix"
    ) as server:
        client = server.client()
        texts = [
            client.completions.create(model=None, prompt="Count: one two three", max_tokens=12, temperature=0)
            .choices[0]
            .text
            for _ in range(2)
        ]
        assert texts[0] == texts[1]
        assert [r.drafter for r in server.records[-2:]] == ["suffix", "suffix"]
        assert [r.mode for r in server.records[-2:]] == ["speculative", "speculative"]
    assert all(
        slot.drafters["suffix"].cache is bundled_engine.suffix_cache
        for slot in server.scheduler.slots
        if "suffix" in slot.drafters
    )
