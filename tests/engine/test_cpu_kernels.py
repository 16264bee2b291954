"""The engine's C++ attention kernels (engine/kernels.py; the row-times kernel has tests/engine/test_row_kernel.py).

- prefill_attention.cpp: causal attention of a whole bf16 prompt, as close to the exact result as torch's own bf16
  attention, whatever the heads, length and thread count; the decoder's prompt through it, eager and compiled,
  as through torch's kernel.
- lane_attention.cpp: a batched round's attention over the float32 cache pool, each sequence over its own
  prefix, as torch's path computes it; pooled slots through it as eager decoders with caches of their own.

Both refuse what they do not take with a clear error."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specwatch.engine import decoder as decoders
from specwatch.engine.decoder import LlamaDecoder, _lane_attention_by_torch, forward_batch, pool_caches, warm_up
from specwatch.engine.kernels import lane_attention_kernel, prefill_attention_kernel, why_not
from tests.engine.conftest import tiny_llama

# each kernel is a library of its own: a CPU with AVX512F but not AVX512-BF16 tests the lane kernel alone
needs_prefill = pytest.mark.skipif(
    not prefill_attention_kernel(),
    reason=f"the prefill-attention kernel is not in use: {why_not('prefill')}",
)
needs_lane = pytest.mark.skipif(
    not lane_attention_kernel(),
    reason=f"the lane-attention kernel is not in use: {why_not('lane')}",
)


def qkv(heads: int, kv_heads: int, n: int, dim: int, seed: int, spread: float = 1.0):
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(h, n, dim, generator=generator) * spread).bfloat16() for h in (heads, kv_heads, kv_heads)]


def exact(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True, enable_gqa=True)


@needs_prefill
@pytest.mark.parametrize(
    ("heads", "kv_heads", "n", "dim", "spread"),
    [
        (9, 3, 1, 64, 1.0),  # one token
        (9, 3, 63, 64, 1.0),  # a block's edge: 63, 64, 65 keys
        (9, 3, 64, 64, 1.0),
        (9, 3, 65, 64, 1.0),
        (4, 4, 301, 64, 2.0),  # no grouping; a short last tile
        (6, 1, 130, 128, 1.0),  # the other head size
        (8, 2, 97, 128, 4.0),  # sharp softmax: the running maximum rescales often
        (9, 3, 700, 64, 1.0),
    ],
)
def test_prefill_attention_is_as_close_to_exact_as_torchs_bf16_attention(heads, kv_heads, n, dim, spread):
    q, k, v = qkv(heads, kv_heads, n, dim, seed=n * 31 + dim, spread=spread)
    got = torch.ops.specwatch_cpu.prefill_attention(q, k, v, dim**-0.5)
    torch_bf16 = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    want = exact(q, k, v)
    assert got.dtype == torch.bfloat16 and got.shape == q.shape and torch.isfinite(got).all()
    assert (got.double() - want).abs().max() <= 2 * (torch_bf16.double() - want).abs().max() + 2e-3


@needs_prefill
def test_prefill_attention_takes_its_scale():
    q, k, v = qkv(6, 2, 50, 64, seed=1)
    got = torch.ops.specwatch_cpu.prefill_attention(q, k, v, 0.3)
    q64, k64, v64 = q.double(), k.double(), v.double()
    want = F.scaled_dot_product_attention(q64, k64, v64, is_causal=True, enable_gqa=True, scale=0.3)
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)


@needs_prefill
def test_a_position_sees_no_later_key():
    """Changing the last key and value changes the last position's output only."""
    q, k, v = qkv(9, 3, 130, 64, seed=2)
    before = torch.ops.specwatch_cpu.prefill_attention(q, k, v, 0.125)
    k[:, -1], v[:, -1] = 30.0, -30.0
    after = torch.ops.specwatch_cpu.prefill_attention(q, k, v, 0.125)
    assert torch.equal(before[:, :-1], after[:, :-1]) and not torch.equal(before[:, -1], after[:, -1])


@needs_prefill
def test_prefill_attention_runs_on_several_threads_as_on_one():
    q, k, v = qkv(9, 3, 517, 64, seed=3)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torch.ops.specwatch_cpu.prefill_attention(q, k, v, 0.125)
        torch.set_num_threads(2)
        two = torch.ops.specwatch_cpu.prefill_attention(q, k, v, 0.125)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


bf16 = torch.ones((2, 5, 64), dtype=torch.bfloat16)


@needs_prefill
@pytest.mark.parametrize(
    ("q", "k", "v", "message"),
    [
        (bf16.float(), bf16, bf16, "contiguous bfloat16"),
        (bf16, bf16.transpose(0, 1).contiguous().transpose(0, 1), bf16, "contiguous bfloat16"),
        (bf16, bf16[:, :4].contiguous(), bf16[:, :4].contiguous(), "as many keys as queries"),
        (torch.ones((3, 5, 64), dtype=torch.bfloat16), bf16, bf16, "multiple of key heads"),
        (bf16[..., :32].contiguous(), bf16[..., :32].contiguous(), bf16[..., :32].contiguous(), "head dim 64 or 128"),
        (bf16, bf16, bf16[:1].contiguous(), r"q \[heads, n, dim\]"),
        (bf16[:, :0], bf16[:, :0], bf16[:, :0], "as many keys as queries"),
    ],
)
def test_prefill_attention_refuses_what_it_does_not_take(q, k, v, message):
    with pytest.raises(RuntimeError, match=message):
        torch.ops.specwatch_cpu.prefill_attention(q, k, v, 0.125)


@pytest.fixture(scope="module")
def model():
    """bf16 Llama with heads of 64 (the kernel's size): 4 query heads over 2 key heads."""
    return tiny_llama(seed=21, layers=2, hidden=256).to(torch.bfloat16)


def prompt_and_greedy(decoder: LlamaDecoder, prompt: torch.Tensor, steps: int) -> tuple[torch.Tensor, list[int]]:
    decoder.reset(prompt.shape[0] + steps + 1)
    first = logits = decoder.forward(prompt, keep=1)
    tokens = []
    for _ in range(steps):
        tokens.append(int(logits[-1].argmax()))
        logits = decoder.forward(torch.tensor([tokens[-1]]))
    return first, tokens


@needs_prefill
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_the_decoders_prompt_attends_by_the_kernel_as_by_torchs(model, compiled):
    kernel, reference = LlamaDecoder(model, for_compile=compiled), LlamaDecoder(model)
    assert kernel.prefill_kernel
    reference.prefill_kernel = False
    if compiled:
        kernel.compiled = True
        warm_up(kernel)
    prompt = torch.randint(0, 256, (150,), generator=torch.Generator().manual_seed(8))
    with torch.profiler.profile() as profile:
        got, got_tokens = prompt_and_greedy(kernel, prompt, 20)
    want, want_tokens = prompt_and_greedy(reference, prompt, 20)
    calls = {event.key: event.count for event in profile.key_averages()}
    assert calls.get("specwatch_cpu::prefill_attention") == 2  # once a layer, the prompt only
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    assert got_tokens == want_tokens


def pool(lanes: int, kv_heads: int, length: int, dim: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(lanes, kv_heads, length, dim, generator=generator) for _ in range(2)]


@needs_lane
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "seqs"),
    [
        (9, 3, 64, [(lane, 10 + 37 * lane, 1) for lane in range(8)]),  # a decode round: one row each, unlike lengths
        (9, 3, 64, [(3, 200, 9), (0, 0, 1), (1, 5, 4), (6, 0, 30)]),  # verifications, a first row, a prompt chunk
        (4, 4, 64, [(2, 17, 2), (1, 99, 1)]),  # no grouping, lanes out of order
        (8, 1, 128, [(0, 64, 5), (5, 250, 1)]),  # the other head size, one key head for eight
        (12, 2, 64, [(4, 299, 1)]),  # the last position of the pool
    ],
)
def test_lane_attention_kernel_is_torchs_attention_over_each_sequences_own_prefix(heads, kv_heads, dim, seqs):
    keys, values = pool(8, kv_heads, 300, dim, seed=len(seqs) * 7 + dim)
    rows = sum(n for *_, n in seqs)
    q = torch.randn(rows, heads, dim, generator=torch.Generator().manual_seed(heads))
    got = torch.ops.specwatch_cpu.lane_attention(q, keys, values, torch.tensor(seqs))
    want = _lane_attention_by_torch(q, keys, values, torch.tensor(seqs))
    assert got.shape == q.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_lane
def test_lane_attention_kernel_runs_on_several_threads_as_on_one():
    keys, values = pool(6, 3, 700, 64, seed=4)
    seqs = torch.tensor([(lane, 100 * lane, 1 + lane % 3) for lane in range(6)])
    q = torch.randn(int(seqs[:, 2].sum()), 9, 64)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torch.ops.specwatch_cpu.lane_attention(q, keys, values, seqs)
        torch.set_num_threads(2)
        two = torch.ops.specwatch_cpu.lane_attention(q, keys, values, seqs)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


keys32 = torch.zeros(2, 1, 16, 64)


@needs_lane
@pytest.mark.parametrize(
    ("q", "keys", "bounds", "message"),
    [
        (torch.zeros(1, 2, 64), keys32, [[2, 0, 1]], r"outside the pool \(lane 2"),
        (torch.zeros(1, 2, 64), keys32, [[0, 16, 1]], "outside the pool"),
        (torch.zeros(2, 2, 64), keys32, [[0, 14, 3]], "outside the pool"),
        (torch.zeros(1, 2, 64), keys32, [[0, 3, 0]], "outside the pool"),
        (torch.zeros(3, 2, 64), keys32, [[0, 3, 2]], "bounds cover 2 rows, q holds 3"),
        (torch.zeros(1, 2, 64, dtype=torch.bfloat16), keys32, [[0, 3, 1]], "contiguous float32"),
        (torch.zeros(1, 2, 32), keys32[..., :32].contiguous(), [[0, 3, 1]], "head dim 64 or 128"),
        (torch.zeros(1, 3, 64), torch.zeros(2, 2, 16, 64), [[0, 3, 1]], "multiple of key heads"),
        (torch.zeros(1, 2, 64), keys32, [[0, 3]], r"bounds int64 \[sequences, 3\]"),
    ],
)
def test_lane_attention_kernel_refuses_what_it_does_not_take(q, keys, bounds, message):
    with pytest.raises(RuntimeError, match=message):
        torch.ops.specwatch_cpu.lane_attention(q, keys, keys.clone(), torch.tensor(bounds))


@needs_lane
def test_pooled_slots_attend_by_the_kernel_as_eager_decoders_over_caches_of_their_own(monkeypatch):
    """float32 slots with heads of 64 in one compiled cache pool: decode rounds and verifications of unlike
    lanes through `specwatch_cpu::lane_attention`, the logits of eager decoders attending by torch's kernel
    (each sequence over a cache of its own)."""
    model = tiny_llama(seed=23, layers=2, hidden=256)
    slots, eager = [LlamaDecoder(model) for _ in range(3)], [LlamaDecoder(model) for _ in range(3)]
    for slot in slots:
        slot.compiled = True
    warm_up(slots[0])
    pool_caches(slots)
    draws = torch.Generator().manual_seed(17)
    for lane, length in enumerate((7, 70, 150)):
        prompt = torch.randint(0, 256, (length,), generator=draws)
        for decoder in (slots[lane], eager[lane]):
            decoder.reset(200)
            decoder.forward(prompt, keep=1)
    calls = 0
    for rows in ([1, 1, 1], [4, 1, 9], [1, 1, 1]):
        fed = [torch.randint(0, 256, (n,), generator=draws) for n in rows]
        with monkeypatch.context() as torch_only:
            torch_only.setattr(decoders, "lane_attention_kernel", lambda: False)
            want = forward_batch(eager, fed, [0, 0, 0])
        with torch.profiler.profile() as profile:
            got = forward_batch(slots, fed, [0, 0, 0])
        calls += {event.key: event.count for event in profile.key_averages()}.get("specwatch_cpu::lane_attention", 0)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
            assert torch.equal(a.argmax(-1), b.argmax(-1))
    assert calls == 3 * 2  # three rounds, once a layer
