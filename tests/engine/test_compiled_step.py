"""The plain decode step and the several-row verification through torch.compile (`EngineConfig.compile`):
same logits as the eager forwards, each compiled once for every position, row count, cache size and
decoder over the same model."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo

from specwatch.engine.decoder import (
    CachePool,
    LlamaDecoder,
    _attention_plan,
    cpu_prepack,
    forward_batch,
    pool_caches,
    warm_up,
)
from specwatch.engine.kernels import row_times_kernel, why_not
from tests.engine.conftest import tiny_llama

pool_forward = CachePool.forward


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=7, layers=2)


def greedy(decoder: LlamaDecoder, prompt: torch.Tensor, steps: int) -> tuple[list[int], list[torch.Tensor]]:
    logits = decoder.forward(prompt, keep=1)
    tokens, rows = [], [logits]  # the prompt's last row first
    for _ in range(steps):
        token = logits[-1].argmax().view(1)
        tokens.append(token.item())
        logits = decoder.forward(token)
        rows.append(logits)
    return tokens, rows


def test_compiled_step_matches_eager_and_compiles_once(model):
    eager, compiled = LlamaDecoder(model), LlamaDecoder(model)
    assert compiled.steps_alone  # float32 on a CPU: the single-row step exists
    compiled.compiled = True
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    warm_up(compiled)
    assert compiled.packed  # so the verification rows have their graph too
    # the step, the rows and the prompt (its last row through the head)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs + 3
    prompt = torch.randint(0, 256, (5,), generator=torch.Generator().manual_seed(3))
    eager.reset(64), compiled.reset(64)
    with torch._dynamo.config.patch(error_on_recompile=True):  # every later position, cache and decoder: no recompile
        want, want_rows = greedy(eager, prompt, 40)
        got, got_rows = greedy(compiled, prompt, 40)
        assert got == want
        for a, b in zip(got_rows, want_rows):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        other = LlamaDecoder(model)
        other.compiled = True
        other.reset(300)
        eager.reset(300)
        long_prompt = torch.randint(0, 256, (150,), generator=torch.Generator().manual_seed(4))
        assert greedy(other, long_prompt, 20)[0] == greedy(eager, long_prompt, 20)[0]
    assert compiled.length == 5 + 40


@pytest.mark.skipif(not cpu_prepack(torch.float32), reason="needs oneDNN (the packed float32 weights)")
def test_a_float32_decoder_built_for_compile_steps_by_reductions_and_matches_eager():
    """Built `for_compile`, float32 keeps its weights [out, in] (no input-major copy) and its compiled
    single-row step multiplies by Inductor's reductions over them, as bf16 does; same greedy tokens and
    logits as the eager forward."""
    fresh = tiny_llama(seed=11, layers=2)  # a model no decoder has fused yet: this one picks the layout
    compiled = LlamaDecoder(fresh, for_compile=True)
    eager = LlamaDecoder(fresh)
    assert compiled.lm_head.by_columns is None and eager.lm_head is compiled.lm_head  # one layout, shared
    compiled.compiled = True
    assert compiled.steps_alone
    warm_up(compiled)
    prompt = torch.randint(0, 256, (7,), generator=torch.Generator().manual_seed(5))
    eager.reset(64), compiled.reset(64)
    want, want_rows = greedy(eager, prompt, 30)
    got, got_rows = greedy(compiled, prompt, 30)
    assert got == want
    for a, b in zip(got_rows, want_rows):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert LlamaDecoder(tiny_llama(seed=12, layers=2)).lm_head.by_columns is not None  # eager: input-major


@pytest.mark.parametrize("kernel", [False, True], ids=["inductor-reduction", "row-kernel"])
def test_compiled_bf16_step_matches_eager_and_compiles_once(model, monkeypatch, kernel):
    """bf16 where oneDNN packs it: compiled, one row after a prefix takes a step of its own (its products
    by the engine's C++ kernel or as reductions Inductor writes over the [out, in] weights, `_row_times`):
    at every position the eager logits within bf16's rounding, compiled once for every position and cache size."""
    if not cpu_prepack(torch.bfloat16):
        pytest.skip("this torch build or CPU packs no bf16 weights for oneDNN (nothing to compile)")
    if kernel and not row_times_kernel():
        pytest.skip(f"the row-times kernel is not in use: {why_not('row')}")
    model = copy.deepcopy(model).to(torch.bfloat16)
    eager, compiled = LlamaDecoder(model), LlamaDecoder(model, for_compile=True)
    assert not eager.row_kernel  # only a decoder built for compile takes the kernel
    assert compiled.row_kernel == row_times_kernel()
    compiled.row_kernel = kernel
    assert not compiled.steps_alone  # eager bf16: one row takes the ragged batch
    compiled.compiled = True
    assert compiled.steps_alone
    warm_up(compiled)
    steps, step = [], LlamaDecoder._step
    monkeypatch.setattr(LlamaDecoder, "_step", lambda self, token: steps.append(self) or step(self, token))
    prompt = torch.randint(0, 256, (9,), generator=torch.Generator().manual_seed(6))
    for max_len in (64, 300):  # a second request with a larger cache: no recompile either
        eager.reset(max_len), compiled.reset(max_len)
        with torch._dynamo.config.patch(error_on_recompile=True):
            tokens, want = greedy(eager, prompt, 40)
            got = [compiled.forward(prompt, keep=1)] + [compiled.forward(torch.tensor([t])) for t in tokens]
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=TOLERANCE[torch.bfloat16], atol=TOLERANCE[torch.bfloat16])
        assert compiled.length == eager.length == 9 + 40
    assert steps == [compiled] * 80


@pytest.mark.parametrize("rows", [1, 3], ids=["step", "verification"])
def test_compiled_forwards_refuse_a_full_cache(model, rows):
    decoder = LlamaDecoder(model)
    decoder.compiled = True
    decoder.reset(4)
    decoder.forward(torch.zeros(4, dtype=torch.long))
    with pytest.raises(RuntimeError, match=f"KV cache holds 4 tokens, asked for {4 + rows}"):
        decoder.forward(torch.zeros(rows, dtype=torch.long))
    assert decoder.length == 4


def test_compiled_verification_rows_match_eager_for_every_count_without_recompiling(model):
    eager, compiled = LlamaDecoder(model), LlamaDecoder(model)
    compiled.compiled = True
    warm_up(compiled)
    draws = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, 256, (7,), generator=draws)
    for decoder in (eager, compiled):
        decoder.reset(128)
        decoder.forward(prompt, keep=1)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for rows in (2, 3, 9, 4, 1, 16, 5):  # 2: as many rows as the model has KV heads
            draft = torch.randint(0, 256, (rows,), generator=draws)
            want, got = eager.forward(draft), compiled.forward(draft)
            assert got.shape == (rows, model.config.vocab_size)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            assert torch.equal(got.argmax(-1), want.argmax(-1))
            accepted = rows // 2
            for decoder in (eager, compiled):  # a rejection: both caches back to the accepted prefix
                decoder.crop(decoder.length - rows + accepted + 1)
            assert compiled.length == eager.length
    final = torch.tensor([1, 2, 3])
    torch.testing.assert_close(compiled.forward(final), eager.forward(final), rtol=1e-4, atol=1e-4)


def compiled_slots(model, count: int) -> list[LlamaDecoder]:
    slots = [LlamaDecoder(model) for _ in range(count)]
    for slot in slots:
        slot.compiled = True
    return slots


# bf16: the compiled kernels round once where eager rounds after every op, hence the looser bound
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pooled_slots_verify_together_as_eager_does_without_recompiling(model, dtype):
    """A server's slots in one cache pool: every round's rows (any lanes, any row counts, after
    rejections, across a pool that grows mid-request) in one compiled forward, per sequence the
    logits of the eager ragged batch over caches of their own. In bf16 (where a lone row
    takes the single-row step) as in float32."""
    if not cpu_prepack(dtype):
        pytest.skip(f"this torch build or CPU packs no {dtype} weights for oneDNN (nothing to compile)")
    model = copy.deepcopy(model).to(dtype)
    slots, eager = compiled_slots(model, 4), [LlamaDecoder(model) for _ in range(4)]
    assert all(slot.compilable for slot in slots)
    warm_up(slots[0])
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert pool_caches(slots) > 0
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs + 1  # every round, one row each or several
    draws = torch.Generator().manual_seed(11)
    for lane, (pooled, plain) in enumerate(zip(slots, eager)):
        prompt = torch.randint(0, 256, (5 + 3 * lane,), generator=draws)
        for decoder in (pooled, plain):
            decoder.reset(48)
            decoder.forward(prompt, keep=1)
    rounds = [(0, 1, 2, 3), (0, 1, 2, 3), (1, 3), (0, 2, 3), (0, 1, 2, 3), (2, 3), (0, 1)]
    with torch._dynamo.config.patch(error_on_recompile=True):
        for number, lanes in enumerate(rounds):
            if number == 4:  # a new request on lane 1 needs a longer cache: the pool grows, lanes keep theirs
                prompt = torch.randint(0, 256, (60,), generator=draws)
                for decoder in (slots[1], eager[1]):
                    decoder.reset(120)
                    decoder.forward(prompt, keep=1)
                assert slots[0].pool.max_len == 120
            rows = [1 if number % 2 else 1 + (lane * 5 + number) % 7 for lane in lanes]
            fed = [torch.randint(0, 256, (n,), generator=draws) for n in rows]
            want = forward_batch([eager[i] for i in lanes], fed, [0] * len(lanes))
            got = forward_batch([slots[i] for i in lanes], fed, [0] * len(lanes))
            for a, b, n in zip(got, want, rows):
                assert a.shape == (n, model.config.vocab_size)
                torch.testing.assert_close(a, b, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])
                assert dtype != torch.float32 or torch.equal(a.argmax(-1), b.argmax(-1))
            for i, n in zip(lanes, rows):  # a rejection keeps about half of each lane's rows
                for decoder in (slots[i], eager[i]):
                    decoder.crop(decoder.length - n + (n + 1) // 2)
            assert [d.length for d in slots] == [d.length for d in eager]
        # a lane on its own still takes the compiled step and rows, over its share of the pool
        tolerance = TOLERANCE[dtype]
        torch.testing.assert_close(
            slots[2].forward(fed[0][:1]), eager[2].forward(fed[0][:1]), rtol=tolerance, atol=tolerance
        )


def test_a_prompt_fed_in_chunks_beside_pooled_lanes_gives_what_the_whole_prompt_alone_gives(model, monkeypatch):
    """A new request's prompt in chunks (from position 0, then mid-prompt; its last row's logits kept) in
    one forward with the rows of other lanes of the pool, through the pool's compiled graph: the logits of
    decoders with caches of their own, no recompile, and the last chunk's row is what the whole prompt
    prefilled alone gives."""
    pooled = []
    monkeypatch.setattr(CachePool, "forward", lambda pool, *args: pooled.append(args) or pool_forward(pool, *args))
    slots, eager = compiled_slots(model, 3), [LlamaDecoder(model) for _ in range(3)]
    warm_up(slots[0])
    pool_caches(slots)
    draws = torch.Generator().manual_seed(13)
    for lane in (0, 1):
        prompt = torch.randint(0, 256, (9 + lane,), generator=draws)
        for decoder in (slots[lane], eager[lane]):
            decoder.reset(96)
            decoder.forward(prompt, keep=1)
    slots[2].reset(96), eager[2].reset(96)
    long_prompt = torch.randint(0, 256, (40,), generator=draws)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for chunk in (long_prompt[:16], long_prompt[16:31], long_prompt[31:]):
            fed = [torch.randint(0, 256, (1,), generator=draws), torch.randint(0, 256, (3,), generator=draws), chunk]
            want = forward_batch(eager, fed, [0, 0, 1])
            got = forward_batch(slots, fed, [0, 0, 1])
            assert [g.shape[0] for g in got] == [1, 3, 1]
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    alone = LlamaDecoder(model)
    alone.reset(96)
    torch.testing.assert_close(got[2], alone.forward(long_prompt, keep=1), rtol=1e-4, atol=1e-4)
    assert [d.length for d in slots] == [9 + 3, 10 + 3 * 3, 40]
    assert [keep for *_, keep in pooled[-3:]] == [[0, 0, 1]] * 3  # the chunks rode in the pool's graph


def test_a_pooled_forward_past_a_lanes_room_fails_whole(model):
    slots = compiled_slots(model, 3)
    warm_up(slots[0])
    pool_caches(slots)
    for slot in slots:
        slot.reset(10)
        slot.forward(torch.zeros(8, dtype=torch.long))
    with pytest.raises(RuntimeError, match="KV cache holds 10 tokens, asked for 11"):
        forward_batch(slots, [torch.zeros(n, dtype=torch.long) for n in (1, 2, 3)], [0] * 3)
    assert [slot.length for slot in slots] == [8, 8, 8]  # no cache advanced


@pytest.mark.parametrize(
    "seqs, calls",
    [
        ([(0, 30, 1), (1, 28, 1), (2, 31, 1)], 1),
        ([(0, 30, 1), (1, 30, 1), (2, 30, 1), (3, 30, 1)], 1),
        ([(0, 250, 1), (1, 5, 1), (2, 6, 1), (3, 4, 1)], 2),
        ([(2, 22, 1), (0, 20, 1)], 1),
        ([(2, 200, 3), (0, 10, 1), (1, 5, 4)], 2),
        ([(1, 0, 6), (0, 40, 1), (2, 12, 9)], 1),
        ([(0, 0, 90), (3, 0, 90)], 2),
        ([(0, 0, 3), (1, 0, 3)], 1),
        ([(0, 10, 7), (1, 20, 5)], 1),
    ],
    ids=[
        "alike-padded-into-one-call",
        "as-long-one-call-unmasked",
        "a-long-lane-on-its-own",
        "an-idle-lane-padded-over-out-of-order",
        "unlike-rows-apart",
        "prompt-chunk-beside-rows",
        "prompts-apart",
        "prompts-padded",
        "unequal-rows-padded",
    ],
)
def test_lane_attention_is_softmax_attention_over_each_rows_own_prefix(seqs, calls):
    assert len(_attention_plan(tuple(seqs), torch.device("cpu"))) == calls  # the case the id names
    heads, kv, dim = 4, 2, 8
    draws = torch.Generator().manual_seed(2)
    keys, values = (torch.randn(4, kv, 256, dim, generator=draws) for _ in range(2))
    q = torch.randn(sum(n for *_, n in seqs), heads, dim, generator=draws)
    got = torch.ops.specwatch.lane_attention(q, keys, values, torch.tensor(seqs))
    row = 0
    for lane, start, n in seqs:
        for position in range(start, start + n):
            k, v = (t[lane, :, : position + 1].repeat_interleave(heads // kv, 0) for t in (keys, values))
            weights = torch.softmax((k @ q[row].unsqueeze(-1)).squeeze(-1) / dim**0.5, dim=-1)  # [head, key]
            torch.testing.assert_close(got[row], (weights.unsqueeze(-1) * v).sum(1), rtol=1e-5, atol=1e-5)
            row += 1


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_bf16_cache_attends_as_the_float32_cache_within_bf16_rounding(model, compiled):
    """Where torch's attention kernel runs bf16 on AMX tiles (`amx_attention`) a bf16 model keeps its cache
    in bf16 and attends there: a prompt, steps after it and a verification, each within bf16's rounding of
    the same decoder over a float32 cache, and the same greedy tokens."""
    model = copy.deepcopy(model).to(torch.bfloat16)
    if compiled and not cpu_prepack(torch.bfloat16):
        pytest.skip("this torch build or CPU packs no bf16 weights for oneDNN (nothing to compile)")
    in_bf16, in_float32 = LlamaDecoder(model), LlamaDecoder(model)
    in_bf16.cache_dtype, in_float32.cache_dtype = torch.bfloat16, torch.float32
    for decoder in (in_bf16, in_float32):
        decoder.compiled = compiled
        decoder.reset(200)
    assert in_bf16.k_cache[0].dtype == torch.bfloat16 and in_float32.k_cache[0].dtype == torch.float32
    prompt = torch.randint(0, 256, (150,), generator=torch.Generator().manual_seed(8))
    got, want = greedy(in_bf16, prompt, 12), greedy(in_float32, prompt, 12)
    assert got[0] == want[0]
    for a, b in zip(got[1], want[1]):
        torch.testing.assert_close(a, b, rtol=TOLERANCE[torch.bfloat16], atol=TOLERANCE[torch.bfloat16])
    assert not torch.equal(got[1][0], want[1][0])  # the other kernel ran
    draft = torch.tensor([5, 17, 3, 99])
    torch.testing.assert_close(in_bf16.forward(draft), in_float32.forward(draft), rtol=2e-2, atol=2e-2)
